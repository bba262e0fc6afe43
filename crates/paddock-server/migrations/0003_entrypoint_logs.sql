-- The newest output and the end of each sandbox's entrypoint, so that why it failed can be read
-- after the server restarts, and by the CLI on the same data directory. Written by the server
-- while the entrypoint runs (at most every few seconds) and when it ends; deleted with its row.
CREATE TABLE entrypoint_logs (
    id             TEXT PRIMARY KEY NOT NULL,  -- the sandbox
    command        TEXT NOT NULL,
    tail           BLOB NOT NULL,              -- the newest output, stdout and stderr combined
    truncated      INTEGER NOT NULL,           -- 1 when older output was dropped
    exit_code      INTEGER,
    error          TEXT,
    started_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER
);
