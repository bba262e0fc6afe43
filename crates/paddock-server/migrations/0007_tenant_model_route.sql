-- A tenant's own model route (`paddock tenant set NAME --llm-base URL --llm-key-file PATH`):
-- JSON {base, keyFile}. The provider key stays in its file, which the server reads when a call
-- goes out, so the database never holds it and replacing the file rotates it.
ALTER TABLE tenants ADD COLUMN model_route TEXT;
