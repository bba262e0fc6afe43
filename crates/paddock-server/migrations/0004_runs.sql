-- Runs: work that queues by tier and runs in a sandbox as attempts, each with an epoch. The row
-- is the truth about a run: which attempt is current (epoch, sandbox, boot of the server that
-- drives it) and how the run ended. Inputs and results are files under <data>/runs/<id>/.
CREATE TABLE runs (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,  -- submission order: FIFO within a tier
    id                TEXT NOT NULL UNIQUE,
    tier              TEXT NOT NULL,
    state             TEXT NOT NULL,      -- queued starting running requeued succeeded failed cancelled
    thread            TEXT,
    evaluation        TEXT,               -- the evaluation it is a task of (POST /v1/evaluations)
    request           TEXT NOT NULL,      -- the submitted request (JSON), without inputs
    idempotency_key   TEXT UNIQUE,
    attempt           INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    epoch             INTEGER NOT NULL DEFAULT 0,
    sandbox_id        TEXT,
    boot              TEXT,               -- the server start that drives the current attempt
    exit_code         INTEGER,
    reason            TEXT,
    has_inputs        INTEGER NOT NULL DEFAULT 0,
    has_result        INTEGER NOT NULL DEFAULT 0,
    lease_expires_ms  INTEGER,
    not_before_ms     INTEGER,            -- a requeued run waits for its backoff
    created_at_ms     INTEGER NOT NULL,
    updated_at_ms     INTEGER NOT NULL,
    started_at_ms     INTEGER,            -- the current attempt's admission
    first_call_at_ms  INTEGER,            -- the current attempt's first gateway call
    finished_at_ms    INTEGER
);
CREATE INDEX runs_state ON runs (state, tier, seq);
CREATE INDEX runs_thread ON runs (thread, state);
CREATE INDEX runs_evaluation ON runs (evaluation, seq);

CREATE TABLE run_events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    type    TEXT NOT NULL,
    data    TEXT NOT NULL,   -- JSON
    at_ms   INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
