-- Everything the server knows about a sandbox beyond what its runtime keeps.
CREATE TABLE sandboxes (
    id            TEXT PRIMARY KEY NOT NULL,
    state         TEXT NOT NULL,                 -- OpenSandbox state: Running, Paused, Terminated, Failed...
    reason        TEXT,
    message       TEXT,
    image         TEXT NOT NULL,
    entrypoint    TEXT NOT NULL,                 -- JSON array
    metadata      TEXT NOT NULL,                 -- JSON object
    extensions    TEXT NOT NULL,                 -- JSON object
    token         TEXT NOT NULL,                 -- bearer token of this sandbox's execd endpoint
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER,
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX sandboxes_state ON sandboxes(state);
