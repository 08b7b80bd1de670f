"""Open an `ssmlm analyze report` page in headless Chromium and check that every image loaded.

Exit status 0 when every <img> decoded (naturalWidth > 0), 1 when one did not (each is named), 2 when no
Chromium could be run. The page is not changed: a copy with a small checking script is what is opened
(ssmlm.analyze.report.check_images). Needs a Chromium on PATH; on Debian: `apt-get install -y chromium`.

    python benchmarks/check_report.py runs/gmlp_base/analysis/index.html
    python benchmarks/check_report.py PAGE --browser /usr/bin/chromium
"""

from __future__ import annotations

import argparse
import json
import sys

from ssmlm.analyze.report import check_images, find_browser


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", help="the report's index.html")
    parser.add_argument("--browser", help="Chromium executable (default: the first of chromium, ... on PATH)")
    args = parser.parse_args()
    browser = args.browser or find_browser()
    if browser is None:
        print("no Chromium on PATH (apt-get install -y chromium), or give --browser", file=sys.stderr)
        return 2
    try:
        result = check_images(args.page, browser)
    except (OSError, RuntimeError) as e:
        print(f"{args.page}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    if result["broken"] or not result["images"]:
        print(f"{args.page}: {len(result['broken'])} of {result['images']} images did not load: "
              + ", ".join(result["broken"]), file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
