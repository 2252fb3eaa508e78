-- The tail's probe: one entry on the node's own probe stream, and its note. Called with
-- `ProbeArgs` (scripts.rs) on the connection appends use, about every second (tail/probe.rs).
--
-- KEYS[1] probe stream   `<prefix>:probe:{<node id>}`
-- ARGV[1] note channel   ('': no note)
-- ARGV[2] node id        16 hex digits, drawn per process
-- ARGV[3] TTL ms         the stream expires this long after the node's last probe
-- ARGV[4] publish        'PUBLISH', or 'SPUBLISH' on a cluster (ARGV[1] then the probe's own
--                        shard channel, in the slot of KEYS[1])
--
-- Returns the entry ID. The note, `!probe <node id> <entry id>`, is not an append note (`!`
-- is not allowed in a thread id): nodes ignore the probes of other nodes.
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '8', '*', 'n', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[1] ~= '' then
  redis.call(ARGV[4], ARGV[1], '!probe ' .. ARGV[2] .. ' ' .. id)
end
return id
