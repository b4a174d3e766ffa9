"""On PostgreSQL the table refuses UPDATE always, and DELETE unless the
transaction has said it is the retention prune (`SET LOCAL chorus.audit_prune =
'on'`, `audit.services.audit_prune`). SQLite, the embedded single-host default,
has no session settings to tell the prune apart: there the rows are kept
append-only by the code and the admin alone. TRUNCATE, the table owner's
(and the test suite's flush), is left to the database's privileges."""

from django.db import migrations

CREATE = """
CREATE FUNCTION audit_event_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('chorus.audit_prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (%% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER audit_event_append_only
    BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_event_append_only ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_event_append_only();
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=())  # params: "%%" is a literal "%"

    return run


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP))]
