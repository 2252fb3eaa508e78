-- Settles an append whose reply the broker lost (a timeout, a dropped connection): run on
-- another connection, after the append was sent. Built by `OutcomeArgs` (scripts.rs).
--
-- KEYS[1] outcome         the append's `<prefix>:{<thread>}:o:<token>` (append.lua KEYS[4])
-- ARGV[1] fence TTL ms    how long the fence lives
--
-- Returns the append's record `<epoch> <entry id>…` when it ran. Otherwise sets the key to
-- '-' (the fence; append.lua refuses a token whose key exists, so the append, still queued
-- somewhere between the broker and Redis, can no longer run) and returns '-'. Either way the
-- answer is final: asking again returns the same.
local v = redis.call('GET', KEYS[1])
if v then
  return v
end
redis.call('SET', KEYS[1], '-', 'PX', ARGV[1])
return '-'
