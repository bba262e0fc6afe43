-- Signed routes (and endpoints) of a sandbox are signed with its route epoch; revoking them
-- bumps it, so every link signed before stops working. A sandbox without a row is at epoch 0,
-- whose signatures are those of servers before revocation existed. Deleted with the sandbox.
CREATE TABLE route_epochs (
    id    TEXT PRIMARY KEY NOT NULL,  -- the sandbox
    epoch INTEGER NOT NULL
);
