-- Tenants: each API key belongs to one, and a tenant sees only what it made. Keys are kept as
-- SHA-256 digests only (they are 256 random bits, so a digest cannot be reversed by guessing).
-- The server's own key (the api-key file or PADDOCK_API_KEY) is the tenant `default`, which owns
-- every row from before tenants existed and every sandbox adopted from the CLI.
CREATE TABLE tenants (
    name          TEXT PRIMARY KEY NOT NULL,
    quotas        TEXT NOT NULL DEFAULT '{}',   -- JSON: sandboxes, memory, runs {tier: n}, modelTokens
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE tenant_keys (
    digest        TEXT PRIMARY KEY NOT NULL,    -- hex SHA-256 of the key
    tenant        TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER                       -- a rotated key's end of grace; NULL: current
);
CREATE INDEX tenant_keys_tenant ON tenant_keys (tenant);
-- Model tokens a tenant's sandboxes spent through the model route.
CREATE TABLE tenant_usage (
    tenant       TEXT PRIMARY KEY NOT NULL,
    model_tokens INTEGER NOT NULL DEFAULT 0
);
ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE sandboxes ADD COLUMN memory_bytes INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_tenant ON sandboxes (tenant);
ALTER TABLE runs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
CREATE INDEX runs_tenant ON runs (tenant, state, tier);
