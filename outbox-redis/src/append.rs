//! One batch appended by one server-side script: every `XADD` in the order
//! given, and an `XADD` that fails holds back the later events of its key.
//!
//! A pipeline cannot do that (a failed `XADD` does not stop the next), so a
//! pipelined publisher has to send a key's events one per call, and a
//! backlog on one key drains one round trip per event. The script runs
//! atomically: it is answered whole or, on a lost connection, not known at
//! all (then every event of the call is redelivered, in order).

use std::collections::HashMap;

use redis::Script;

/// `KEYS`: the batch's streams. `ARGV`: for each stream its trim (`''`,
/// `MAXLEN` or `MINID`, then the value), then for each event the stream's
/// index, the partition key, the field count and the field names and values.
/// One reply per event: `OK`, `HELD` or `ERR <the server's error>`.
const SCRIPT: &str = r"
local trims = {}
local p = 1
for s = 1, #KEYS do
  trims[s] = { ARGV[p], ARGV[p + 1] }
  p = p + 2
end
local failed = {}
local out = {}
while p <= #ARGV do
  local s, key, n = tonumber(ARGV[p]), ARGV[p + 1], tonumber(ARGV[p + 2])
  p = p + 3
  if failed[key] then
    out[#out + 1] = 'HELD'
  else
    local args = { KEYS[s] }
    if trims[s][1] ~= '' then
      args[#args + 1] = trims[s][1]
      args[#args + 1] = '~'
      args[#args + 1] = trims[s][2]
    end
    args[#args + 1] = '*'
    for j = p, p + 2 * n - 1 do
      args[#args + 1] = ARGV[j]
    end
    local reply = redis.pcall('XADD', unpack(args))
    if type(reply) == 'table' and reply.err then
      failed[key] = true
      out[#out + 1] = 'ERR ' .. reply.err
    else
      out[#out + 1] = 'OK'
    end
  end
  p = p + 2 * n
end
return out
";

/// The script (loaded once per server, then called by its SHA).
pub(crate) fn script() -> Script {
    Script::new(SCRIPT)
}

/// One event of a batch, as the script takes it.
pub(crate) struct Entry {
    pub stream: String,
    pub partition_key: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

/// How an event's `XADD` went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    Ok,
    /// Not tried: an earlier event of its key failed in this call.
    Held,
    /// The server's error, starting with its code (`WRONGTYPE …`).
    Failed(String),
}

impl Appended {
    pub(crate) fn parse(reply: &str) -> Self {
        match reply {
            "OK" => Self::Ok,
            "HELD" => Self::Held,
            other => Self::Failed(other.strip_prefix("ERR ").unwrap_or(other).to_owned()),
        }
    }
}

/// The invocation for `entries`; `trim_of` gives a stream's trim arguments.
pub(crate) fn invocation<'a>(
    script: &'a Script,
    entries: &[Entry],
    trim_of: impl Fn(&str) -> Option<(&'static str, String)>,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for entry in entries {
        let next = index.len() + 1;
        index.entry(entry.stream.as_str()).or_insert_with(|| {
            invocation.key(&entry.stream);
            match trim_of(&entry.stream) {
                Some((kind, value)) => invocation.arg(kind).arg(value),
                None => invocation.arg("").arg(""),
            };
            next
        });
    }
    for entry in entries {
        invocation
            .arg(index[entry.stream.as_str()])
            .arg(&entry.partition_key)
            .arg(entry.fields.len());
        for (name, value) in &entry.fields {
            invocation.arg(name).arg(value.as_slice());
        }
    }
    invocation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_into_outcomes() {
        assert_eq!(Appended::parse("OK"), Appended::Ok);
        assert_eq!(Appended::parse("HELD"), Appended::Held);
        assert_eq!(
            Appended::parse("ERR WRONGTYPE Operation against a key"),
            Appended::Failed("WRONGTYPE Operation against a key".into())
        );
    }
}
