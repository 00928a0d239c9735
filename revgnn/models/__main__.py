"""``python -m revgnn.models``: the zoo table from the registry::

    python -m revgnn.models --markdown                  # print the table
    python -m revgnn.models --update-readme README.md   # write it between the README's zoo markers

``tests/models/test_zoo.py`` fails while the README's table differs from the generated one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m revgnn.models", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the zoo table as markdown")
    group.add_argument("--update-readme", metavar="PATH", help="write the table between the zoo markers")
    args = parser.parse_args(argv)

    from revgnn.models.registry import update_readme, zoo_table

    if args.markdown:
        sys.stdout.write(zoo_table())
    else:
        changed = update_readme(args.update_readme)
        print(f"{args.update_readme}: zoo table {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
