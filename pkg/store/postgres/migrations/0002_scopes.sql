-- lockwarden segment store, schema version 2: every record is keyed by the
-- full scope its fence was issued in.
--
-- Fences are issued per cluster (one lockwarden installation: its
-- FenceCounters and issuer epoch), per namespace and per resource ID. Schema
-- version 1 keyed the records by the resource ID alone, so two namespaces
-- (or two clusters) writing the same resource ID shared one ledger and
-- raised false FENCE_REGRESSION alarms. From version 2 on, every table is
-- keyed by (cluster, namespace, resource).
--
-- Existing rows cannot say which cluster and namespace issued their fences.
-- They are assigned the legacy scope the operator declares, in the settings
-- lockwarden.legacy_cluster and lockwarden.legacy_namespace of the migrating
-- transaction (postgres.Migrate with postgres.AdoptLegacyRecords, or, with
-- your own tooling, SET LOCAL before this file). When rows exist and no
-- legacy scope is declared the migration fails and changes nothing, so a
-- worker refuses to start: guessing a scope could hide receipts (a segment
-- applied twice) or fence history (a missed FENCE_REGRESSION).

DO $$
DECLARE
    legacy_cluster   text := coalesce(current_setting('lockwarden.legacy_cluster', true), '');
    legacy_namespace text := coalesce(current_setting('lockwarden.legacy_namespace', true), '');
BEGIN
    IF (legacy_cluster = '' OR legacy_namespace = '') AND (
        EXISTS (SELECT 1 FROM lockwarden_fences) OR EXISTS (SELECT 1 FROM lockwarden_receipts) OR
        EXISTS (SELECT 1 FROM lockwarden_quarantine) OR EXISTS (SELECT 1 FROM lockwarden_fence_alarms)) THEN
        RAISE EXCEPTION 'NO_RESOURCE: the lockwarden tables hold fence records from before schema version 2, which do not say which cluster and namespace issued them; declare it with lockwarden.legacy_cluster and lockwarden.legacy_namespace (postgres.AdoptLegacyRecords)'
            USING ERRCODE = 'LWS01';
    END IF;
END
$$;

-- The new key columns. Existing rows get the declared legacy scope (the
-- default is evaluated per row while the table is rewritten, so the
-- receipts' immutability trigger does not fire), new rows must name theirs.
ALTER TABLE lockwarden_receipts DROP CONSTRAINT lockwarden_receipts_resource_fkey;

ALTER TABLE lockwarden_fences
    ADD COLUMN cluster   text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_cluster', true), '') CHECK (cluster <> ''),
    ADD COLUMN namespace text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_namespace', true), '') CHECK (namespace <> '');
ALTER TABLE lockwarden_fences ALTER COLUMN cluster DROP DEFAULT, ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE lockwarden_fences DROP CONSTRAINT lockwarden_fences_pkey;
ALTER TABLE lockwarden_fences ADD PRIMARY KEY (cluster, namespace, resource);

ALTER TABLE lockwarden_receipts
    ADD COLUMN cluster   text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_cluster', true), '') CHECK (cluster <> ''),
    ADD COLUMN namespace text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_namespace', true), '') CHECK (namespace <> '');
ALTER TABLE lockwarden_receipts ALTER COLUMN cluster DROP DEFAULT, ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE lockwarden_receipts DROP CONSTRAINT lockwarden_receipts_pkey;
-- One receipt, so at most one effect, per segment of a resource in a scope.
ALTER TABLE lockwarden_receipts ADD PRIMARY KEY (cluster, namespace, resource, root, seq);
ALTER TABLE lockwarden_receipts ADD FOREIGN KEY (cluster, namespace, resource)
    REFERENCES lockwarden_fences (cluster, namespace, resource);

ALTER TABLE lockwarden_quarantine
    ADD COLUMN cluster   text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_cluster', true), '') CHECK (cluster <> ''),
    ADD COLUMN namespace text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_namespace', true), '') CHECK (namespace <> '');
ALTER TABLE lockwarden_quarantine ALTER COLUMN cluster DROP DEFAULT, ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE lockwarden_quarantine DROP CONSTRAINT lockwarden_quarantine_resource_root_seq_digest_key;
ALTER TABLE lockwarden_quarantine ADD UNIQUE (cluster, namespace, resource, root, seq, digest);

ALTER TABLE lockwarden_fence_alarms
    ADD COLUMN cluster   text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_cluster', true), '') CHECK (cluster <> ''),
    ADD COLUMN namespace text NOT NULL DEFAULT coalesce(current_setting('lockwarden.legacy_namespace', true), '') CHECK (namespace <> '');
ALTER TABLE lockwarden_fence_alarms ALTER COLUMN cluster DROP DEFAULT, ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE lockwarden_fence_alarms DROP CONSTRAINT lockwarden_fence_alarms_resource_grant_uid_fence_key;
ALTER TABLE lockwarden_fence_alarms ADD UNIQUE (cluster, namespace, resource, grant_uid, fence);

-- The fence record keeps its whole key: never moved to another scope or
-- resource, never lowered, never deleted.
CREATE OR REPLACE FUNCTION lockwarden_fences_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'lockwarden: the fence record of resource % in namespace % of cluster % cannot be deleted', OLD.resource, OLD.namespace, OLD.cluster
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.resource <> OLD.resource OR NEW.namespace <> OLD.namespace OR NEW.cluster <> OLD.cluster THEN
        RAISE EXCEPTION 'lockwarden: the fence record of resource % in namespace % of cluster % cannot be renamed', OLD.resource, OLD.namespace, OLD.cluster
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'lockwarden: the fence of resource % in namespace % of cluster % cannot go down from % to %', OLD.resource, OLD.namespace, OLD.cluster, OLD.fence, NEW.fence
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
