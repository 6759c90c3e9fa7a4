# The paths the shell test runners share (tests/c, tests/install, tests/emu,
# tests/cuda_emu run.sh); sourced, not run, as
#   source "$(dirname "${BASH_SOURCE[0]}")/../common/paths.sh"
#   HERE                  the sourcing runner's folder (absolute)
#   ROOT                  the repository (two folders up from HERE)
#   build_dir VAR DEFAULT prints the build folder: $VAR when set, else $ROOT/DEFAULT;
#                         creates it

HERE="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
build_dir() { # build_dir VAR DEFAULT
    local dir="${!1:-$ROOT/$2}"
    mkdir -p "$dir" && echo "$dir"
}
