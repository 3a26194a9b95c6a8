#!/usr/bin/env python3
"""Checks the internal links of the built book (scripts/book.sh runs it).

    python3 scripts/check-book-links.py target/book

Every page's relative `href` and `src` must name a file that exists in the built book,
and a `#fragment` must be an id (or a name) in the page it points to. mdBook itself only
warns about some of these, and says nothing of a heading renamed under a link, so this
reads the HTML it wrote. Every broken link is listed, with the page it is on; the exit
status is 1 if there is any. Links with a scheme (https:, mailto:, ...) are outside the
book and not checked. Python 3 standard library only.
"""

import os
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit


class Page(HTMLParser):
    """The links a page makes, and the ids a link into it may name."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links = []  # (attribute, value, line)
        self.ids = set()
        self.base = None

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and tag != "meta":
                self.ids.add(value)
            elif name in ("href", "src"):
                if tag == "base":
                    self.base = value
                else:
                    self.links.append((name, value, self.getpos()[0]))

    handle_startendtag = handle_starttag


def parse(path):
    page = Page()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    page.close()
    return page


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/book")
    if not os.path.isfile(os.path.join(root, "index.html")):
        sys.exit(f"check-book-links: no book at {root} (index.html is missing); build it first")
    pages = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(folder, name)
                pages[path] = parse(path)

    errors, checked, skipped = [], 0, []
    for path, page in sorted(pages.items()):
        where = os.path.relpath(path, root)
        if page.base is not None:
            # mdBook's 404 page resolves its links against the site's URL, not its file.
            skipped.append(where)
            continue
        for attr, value, line in page.links:
            parts = urlsplit(value)
            if parts.scheme or parts.netloc:
                continue
            checked += 1
            if parts.path:
                target = os.path.normpath(os.path.join(os.path.dirname(path), unquote(parts.path)))
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
            else:
                target = path
            shown = f"{where}:{line}: {attr}=\"{value}\""
            if not target.startswith(root + os.sep):
                errors.append(f"{shown}: leads out of the book")
                continue
            if not os.path.isfile(target):
                errors.append(f"{shown}: no file {os.path.relpath(target, root)}")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.endswith(".html"):
                ids = pages[target].ids if target in pages else parse(target).ids
                if fragment not in ids:
                    errors.append(
                        f"{shown}: no id \"{fragment}\" in {os.path.relpath(target, root)}"
                    )

    errors = list(dict.fromkeys(errors))  # an image link and its alt text repeat it
    for line in errors:
        print(line)
    note = f" (not checked, they have a <base>: {', '.join(skipped)})" if skipped else ""
    print(
        f"check-book-links: {len(pages)} pages, {checked} internal links, "
        f"{len(errors)} broken{note}",
        file=sys.stderr,
    )
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
