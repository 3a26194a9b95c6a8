#!/usr/bin/env bash
# Builds the book (docs/) into target/book and checks its internal links.
#
#   scripts/book.sh            # -> target/book/index.html
#
# mdBook is pinned and installed from crates.io into target/tools the first time
# (`cargo install --locked`; nothing global), so this needs only the Rust toolchain and
# python3. It fails on a broken internal link (scripts/check-book-links.py lists them all)
# and on anything mdBook reports as an error, such as an {{#include}} it cannot read,
# which mdBook itself only logs.
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4
tools="$PWD/target/tools"
mdbook="$tools/bin/mdbook"
die() { echo "scripts/book.sh: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 is missing (apt-get install python3)"

start=$(date +%s)
if ! [ -x "$mdbook" ] || [ "$("$mdbook" --version)" != "mdbook v$MDBOOK_VERSION" ]; then
  echo "== installing mdbook $MDBOOK_VERSION into target/tools"
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --root "$tools" --quiet ||
    die "cargo install mdbook $MDBOOK_VERSION failed"
fi

log="$PWD/target/book-build.log"
if ! "$mdbook" build docs >"$log" 2>&1; then
  cat "$log" >&2
  die "mdbook build failed"
fi
if grep -E '(^| )(ERROR|WARN) ' "$log" >/dev/null; then
  cat "$log" >&2
  die "mdbook reported errors or warnings (above)"
fi
python3 scripts/check-book-links.py target/book || die "the book has broken links (above)"
echo "== the book is in target/book/index.html ($(( $(date +%s) - start )) s)"
