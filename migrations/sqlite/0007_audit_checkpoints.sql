-- Signed checkpoints of the audit chain: "record `seq` has hash `hash`", signed by auth with
-- the Ed25519 key in its data dir (never stored here), each naming the checkpoint before it.
-- `sallyctl audit verify` checks every one against the chain, so a database writer who edits
-- a record and re-hashes the rest of the chain is found.
CREATE TABLE audit_checkpoints (
    seq       BIGINT PRIMARY KEY,
    hash      TEXT NOT NULL,
    time      BIGINT NOT NULL,
    prev_seq  BIGINT NOT NULL,
    signature TEXT NOT NULL
);
