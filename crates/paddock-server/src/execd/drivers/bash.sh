# Paddock's Bash code-interpreter and session driver: read by `bash --noprofile --norc` from
# its stdin, which then stays the request channel. Each run arrives as shell lines the server
# builds (the cell written to a file and sourced with stdin from /dev/null, then markers); the
# sourced file runs at top level, so variables, functions, cwd and exports persist.
__PADDOCK_MARK=$'\036'"PADDOCK-${PADDOCK_CODE_NONCE:-} "
unset PADDOCK_CODE_NONCE
__PADDOCK_CELL=$(mktemp "${TMPDIR:-/tmp}/.paddock-cell.XXXXXXXX" 2>/dev/null || echo "/tmp/.paddock-cell.$$")
# An interrupt ends the cell, not the shell (SIGINT reaches the whole process group).
trap 'return 130 2>/dev/null' INT
trap 'rm -f "$__PADDOCK_CELL"' EXIT
printf '%s{"t":"ready"}\n' "$__PADDOCK_MARK"
printf '%s{"t":"ready"}\n' "$__PADDOCK_MARK" >&2
