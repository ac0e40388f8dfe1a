# Sourced by the shell tests that run `mxtrain`: the build under test ($BUILD, default
# build) and its binary as an absolute path, Debian's Python (the one with torch), a scratch
# directory removed on exit, and fail, which prints its message indented and fails the test.
set -u
build="${BUILD:-build}"
bin="$(cd "$build" && pwd)/mxtrain"
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "    $*"; exit 1; }
