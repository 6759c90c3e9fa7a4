# The step runner the shell test scripts share (tests/c/run.sh, tests/install/run.sh);
# sourced, not run.
#   step NAME COMMAND...  runs COMMAND: "== NAME", its output, then "== NAME: ok" or
#                         "== NAME: FAILED"; counts it in $passed or $failed
#   steps_summary LABEL   prints "LABEL: N passed, M failed"; fails when a step failed

passed=0
failed=0
step() { # step NAME COMMAND...
    local name="$1"
    shift
    echo "== $name"
    if "$@"; then
        echo "== $name: ok"
        passed=$((passed + 1))
    else
        echo "== $name: FAILED"
        failed=$((failed + 1))
    fi
}
steps_summary() { # steps_summary LABEL
    echo "$1: $passed passed, $failed failed"
    [[ $failed -eq 0 ]]
}
