from ssmlm.cli import main

main()
