"""Per-device kernel tuning: the tuning database and one tuner per kernel family."""
