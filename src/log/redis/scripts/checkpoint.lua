-- The promoted checkpoint. Built by `HeadArgs` (scripts.rs: same KEYS and ARGV as head).
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] ckpt
-- ARGV[1] fresh epoch    8 hex digits, used if the thread needs a new epoch
-- ARGV[2] idle_ttl ms    ('0': none; always the last argument)
--
-- Returns {epoch, {pos, events}} of the promoted checkpoint (both nil without one), after the
-- epoch check (which deletes the checkpoints of an epoch that ended).
local ep = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
return {ep, redis.call('HMGET', KEYS[3], 'pos', 'events')}
