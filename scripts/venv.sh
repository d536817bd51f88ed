# Sourced by the scripts that install a Python tool into a venv of its own
# under .tools and start it on a loopback port (kafka.sh, sns.sh).

# The tool $1's venv and log under .tools: sets VENV and LOG.
tool_home() {
  VENV=".tools/$1-venv"
  LOG=".tools/$1.log"
  mkdir -p .tools
}

# True when something listens on 127.0.0.1:$PORT.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

# Makes the venv $1 and installs the pinned requirement $3 into it unless
# the Python statement $2 (its imports) already runs there.
venv_with() {
  local venv="$1" check="$2" requirement="$3"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check "$requirement"
  fi
}

# Waits up to $1 tries, $2 s apart, for the tool $3 to listen on $PORT;
# then says so, or fails with its log.
await_listening() {
  local tries="$1" pause="$2" tool="$3"
  for _ in $(seq 1 "$tries"); do
    if listening; then
      echo "    $tool listening on 127.0.0.1:$PORT"
      return 0
    fi
    sleep "$pause"
  done
  echo "error: $tool did not start; see $LOG" >&2
  cat "$LOG" >&2
  exit 1
}
