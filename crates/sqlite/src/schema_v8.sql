-- sandboxd store, schema version 8: runs shared by the replicas on one store. `driver` is
-- the replica (replicas.id) that drives the run, the only one whose events are accepted
-- while its lease lasts; `cancel` a cancel asked for on any replica (its reason), for the
-- driver to act on; `reply` an ask_human answer posted on any replica, not yet taken by the
-- driver. A run's place in its session's order is its rowid (inserts are serialized).
ALTER TABLE runs ADD COLUMN driver TEXT;
ALTER TABLE runs ADD COLUMN cancel TEXT;
ALTER TABLE runs ADD COLUMN reply TEXT;
CREATE INDEX runs_by_driver ON runs (driver, state);
