-- A thread's summary for the admin API (PROTOCOL §12). Built by `HeadArgs` (scripts.rs).
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] ckpt
-- ARGV[1] fresh epoch    8 hex digits, used if the thread needs a new epoch
-- ARGV[2] idle_ttl ms    ('0': none; always the last argument)
--
-- Returns {epoch, info, last} (info: see stream_info; last: `XREVRANGE + - COUNT 1`, the
-- newest entry as {{id, {field, value…}}}, or {} for a stream that does not exist).
-- A thread with neither a stream nor a meta hash is answered as empty (epoch 00000000)
-- without creating its epoch: an admin lookup of an unknown id writes nothing.
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  return {'00000000', stream_info(KEYS[1], KEYS[3], false), {}}
end
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
local last = {}
if live then
  last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
end
return {ep, stream_info(KEYS[1], KEYS[3], live), last}
