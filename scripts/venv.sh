# Sourced by the scripts that install a Python tool into a venv of its own
# under .tools and start it on a loopback port (kafka.sh, sns.sh).

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
