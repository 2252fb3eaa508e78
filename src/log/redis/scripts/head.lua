-- The thread's head. Built by `HeadArgs` (scripts.rs).
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] ckpt
-- ARGV[1] fresh epoch    8 hex digits, used if the thread needs a new epoch
-- ARGV[2] idle_ttl ms    ('0': none; always the last argument)
--
-- Returns {epoch, info} (info: see stream_info).
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
return {ep, stream_info(KEYS[1], KEYS[3], live)}
