# shellcheck shell=bash
# server_url LOG PID [GUARD ARGS...]: prints the HTTP address a `psyche
# server` started in the background (its output going to LOG) listens on,
# once it says so. It waits for that line or for the process to exit, never
# for a fixed time: a loaded machine may take many seconds to start a Go
# binary, and the scripts that source this run in CI beside other work. A
# script with a hang guard of its own passes it as GUARD, run before each
# look: its failure is server_url's.
server_url() {
	local log=$1 pid=$2 url
	shift 2
	while :; do
		url=$(sed -n 's/.*server listening on \(http:[^ ]*\).*/\1/p' "$log" 2>/dev/null | head -1)
		if [ -n "$url" ]; then
			echo "$url"
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "the server (pid $pid) exited before it listened; its output:" >&2
			cat "$log" >&2 2>/dev/null || true
			return 1
		fi
		if [ $# -gt 0 ]; then
			"$@" || return 1
		fi
		sleep 0.1
	done
}
