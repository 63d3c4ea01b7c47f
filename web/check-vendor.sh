#!/usr/bin/env bash
# Checks that every file in web/vendor/ is byte for byte the file npm installs from
# web/package-lock.json (the list is web/vendor/FILES), and that web/vendor/ holds nothing else.
# Run by scripts/test; needs the npm registry (or npm's cache).
set -euo pipefail
web="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$web/package.json" "$web/package-lock.json" "$tmp/"
(cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --silent)
fail=0
listed=()
while read -r dst src; do
  case "$dst" in ''|'#'*) continue ;; esac
  listed+=("$dst")
  if ! cmp -s "$tmp/node_modules/$src" "$web/vendor/$dst"; then
    echo "web/vendor/$dst differs from npm's $src (copy it again: cp node_modules/$src web/vendor/$dst)" >&2
    fail=1
  fi
done < "$web/vendor/FILES"
while IFS= read -r f; do
  f="${f#"$web/vendor/"}"
  [ "$f" = FILES ] && continue
  printf '%s\n' "${listed[@]}" | grep -qxF "$f" || { echo "web/vendor/$f is not listed in web/vendor/FILES" >&2; fail=1; }
done < <(find "$web/vendor" -type f)
[ "$fail" = 0 ] && echo "web/vendor: ${#listed[@]} files match npm"
exit "$fail"
