-- lockwarden segment store, schema version 1.
--
-- Per protected resource: the highest fence accepted and where the
-- operation under it stands (lockwarden_fences), one receipt per accepted
-- segment (lockwarden_receipts), the payloads of conflicting resends
-- (lockwarden_quarantine) and the fence regressions seen
-- (lockwarden_fence_alarms). Every row is written by Store.Apply in the same
-- transaction as the caller's own change.

CREATE TABLE lockwarden_fences (
    resource   text PRIMARY KEY CHECK (resource <> ''),
    -- fence is the highest fence the resource has accepted; 0 before any.
    fence      bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    -- grant_uid and root are the grant and operation root of that fence.
    grant_uid  text NOT NULL DEFAULT '',
    root       text NOT NULL DEFAULT '',
    -- last_seq is the last segment accepted under fence and root.
    last_seq   bigint NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The recorded fence is never lowered, renamed or cleared, whoever asks:
-- traffic after a fence regression resumes with a larger fence (a new issuer
-- epoch), never by editing this table.
CREATE FUNCTION lockwarden_fences_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'lockwarden: the fence record of resource % cannot be deleted', OLD.resource
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.resource <> OLD.resource THEN
        RAISE EXCEPTION 'lockwarden: the fence record of resource % cannot be renamed', OLD.resource
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'lockwarden: the fence of resource % cannot go down from % to %', OLD.resource, OLD.fence, NEW.fence
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER lockwarden_fences_guard
    BEFORE UPDATE OR DELETE ON lockwarden_fences
    FOR EACH ROW EXECUTE FUNCTION lockwarden_fences_guard();

CREATE FUNCTION lockwarden_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'lockwarden: % cannot be truncated', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER lockwarden_fences_no_truncate
    BEFORE TRUNCATE ON lockwarden_fences
    FOR EACH STATEMENT EXECUTE FUNCTION lockwarden_refuse_truncate();

CREATE TABLE lockwarden_receipts (
    resource       text NOT NULL REFERENCES lockwarden_fences (resource),
    root           text NOT NULL CHECK (root <> ''),
    seq            bigint NOT NULL CHECK (seq >= 1),
    receipt_id     uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    fence          bigint NOT NULL CHECK (fence >= 1),
    grant_uid      text NOT NULL,
    digest         text NOT NULL,
    accepted_at    timestamptz NOT NULL,
    -- accepted_order numbers the receipts of all resources in the order
    -- they were accepted (per resource, also the commit order: receipts of
    -- one resource are written under its fence row lock).
    accepted_order bigint GENERATED ALWAYS AS IDENTITY,
    -- One receipt, so at most one effect, per segment.
    PRIMARY KEY (resource, root, seq)
);

-- Receipts are immutable: a resend is answered from them.
CREATE FUNCTION lockwarden_receipts_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'lockwarden: receipts cannot be changed or deleted'
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER lockwarden_receipts_immutable
    BEFORE UPDATE OR DELETE ON lockwarden_receipts
    FOR EACH ROW EXECUTE FUNCTION lockwarden_receipts_immutable();

CREATE TRIGGER lockwarden_receipts_no_truncate
    BEFORE TRUNCATE ON lockwarden_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION lockwarden_refuse_truncate();

-- Resends of an accepted segment with a different payload (SEGMENT_CONFLICT):
-- kept for inspection, never applied. One row per distinct payload.
CREATE TABLE lockwarden_quarantine (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource         text NOT NULL,
    root             text NOT NULL,
    seq              bigint NOT NULL,
    digest           text NOT NULL,
    payload          bytea NOT NULL,
    fence            bigint NOT NULL,
    grant_uid        text NOT NULL,
    caller           text NOT NULL,
    -- conflicts_with is the receipt of the payload that was accepted.
    conflicts_with   uuid NOT NULL REFERENCES lockwarden_receipts (receipt_id),
    attempts         bigint NOT NULL DEFAULT 1,
    first_received_at timestamptz NOT NULL,
    last_received_at  timestamptz NOT NULL,
    UNIQUE (resource, root, seq, digest)
);

-- Fence regressions refused (FENCE_REGRESSION): a coordinator issued a
-- fence the resource had already seen. One row per resource, grant and
-- fence.
CREATE TABLE lockwarden_fence_alarms (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource          text NOT NULL,
    fence             bigint NOT NULL,
    grant_uid         text NOT NULL,
    root              text NOT NULL,
    caller            text NOT NULL,
    highest_fence     bigint NOT NULL,
    highest_grant_uid text NOT NULL,
    highest_root      text NOT NULL,
    detail            text NOT NULL,
    attempts          bigint NOT NULL DEFAULT 1,
    first_raised_at   timestamptz NOT NULL,
    last_raised_at    timestamptz NOT NULL,
    UNIQUE (resource, grant_uid, fence)
);
