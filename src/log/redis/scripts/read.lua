-- A page of the log with its head, in one atomic step. Built by `ReadArgs` (scripts.rs).
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] ckpt
-- ARGV[1] fresh epoch    8 hex digits, used if the thread needs a new epoch
-- ARGV[2] XRANGE start   '-' or '(<id>'
-- ARGV[3] count          entries at most ('0': none, only the head)
-- ARGV[4] idle_ttl ms    ('0': none; always the last argument)
--
-- Returns {epoch, info, {{id, {field, value…}}…}} (info: see stream_info).
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
local info = stream_info(KEYS[1], KEYS[3], live)
local entries = {}
local n = tonumber(ARGV[3])
if live and n > 0 then
  entries = redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', n)
end
return {ep, info, entries}
