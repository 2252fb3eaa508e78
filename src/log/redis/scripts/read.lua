-- A page of the log with its head, in one atomic step. Built by `ReadArgs` (scripts.rs).
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] ckpt
-- ARGV[1] fresh epoch    8 hex digits, used if the thread needs a new one
-- ARGV[2] XRANGE start   '-' or '(<id>'
-- ARGV[3] count          entries at most ('0': none, only the head)
-- ARGV[4] idle_ttl ms    ('0': none; always the last argument)
--
-- Returns {epoch, info, {{id, {field, value…}}…}, held, before} (info: see stream_info).
-- `held` is 1 when the stream holds an entry with exactly the id of a '(<id>' start
-- (`XRANGE id id`, O(log n)): a read after a position the log never had (a tail a failover
-- rolled back) is not exact, even once the log grew past it (check_resumable in log/mod.rs).
-- `before`, only when it is not held: the id of the last entry before it (`XREVRANGE id -
-- COUNT 1`, O(log n)), where the rolled-back history and the log's part (ResumeCheck::fork);
-- '' when there is none or it is held.
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
local info = stream_info(KEYS[1], KEYS[3], live)
local entries = {}
local n = tonumber(ARGV[3])
if live and n > 0 then
  entries = redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', n)
end
local held = 0
local before = ''
if live and string.sub(ARGV[2], 1, 1) == '(' then
  local at = string.sub(ARGV[2], 2)
  if #redis.call('XRANGE', KEYS[1], at, at, 'COUNT', 1) > 0 then
    held = 1
  else
    local last = redis.call('XREVRANGE', KEYS[1], at, '-', 'COUNT', 1)
    if #last > 0 then
      before = last[1][1]
    end
  end
end
return {ep, info, entries, held, before}
