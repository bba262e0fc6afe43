-- Sandbox tokens are no longer stored: each is derived from the server's secret
-- (<data>/token-key) and the sandbox id, so the database opens nothing. Rows keep working;
-- a token handed out before this migration stops working, and a client in direct mode gets
-- the new one from GET /v1/sandboxes/{id}/endpoints/{port} (proxy mode, with the API key, is
-- unaffected). Store::open vacuums the file afterwards so no freed page keeps an old token.
ALTER TABLE sandboxes DROP COLUMN token;
