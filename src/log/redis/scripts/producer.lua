-- A producer's mark. Built by `ProducerArgs` (scripts.rs).
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] ckpt
-- ARGV[1] fresh epoch    8 hex digits, used if the thread needs a new epoch
-- ARGV[2] producer id
-- ARGV[3] idle_ttl ms    ('0': none; always the last argument)
--
-- Returns the producer's last event number in the current epoch (false when none).
ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
return redis.call('HGET', KEYS[2], 'p:' .. ARGV[2])
