package devstack

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"

	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives/timestamp"
	sqliteschema "go.temporal.io/server/schema/sqlite"
)

// retentionDays is how long closed workflows stay visible in the dev
// namespace.
const retentionDays = 7

// sqlConfig is the persistence config for the SQLite file. Temporal's plugin
// passes every key that is not a URI parameter to SQLite as a pragma
// (_pragma=key=value). A misspelled key (for example "_journal_mode", as
// temporaltest spells it) is silently ignored, so spell them exactly.
func sqlConfig(dbPath, synchronous string) *config.SQL {
	return &config.SQL{
		PluginName:   sqliteplugin.PluginName,
		DatabaseName: dbPath,
		ConnectAttributes: map[string]string{
			"mode":         "rwc",
			"journal_mode": "WAL",
			"synchronous":  synchronous,
		},
	}
}

// ensureSchema creates Temporal's main and visibility schema in dbPath unless
// it is already there. It runs in one transaction on a connection of its own,
// so a crash halfway leaves no tables and the next start tries again. It
// reports whether it created the schema.
func ensureSchema(ctx context.Context, dbPath, synchronous string) (created bool, err error) {
	// The sqlite plugin registers modernc.org/sqlite under the name "sqlite".
	q := url.Values{}
	q.Add("_pragma", "journal_mode=WAL")
	q.Add("_pragma", "synchronous="+synchronous)
	q.Add("_pragma", "busy_timeout=5000")
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=rwc&"+q.Encode())
	if err != nil {
		return false, fmt.Errorf("devstack: open %s: %w", dbPath, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("devstack: open %s: %w", dbPath, err)
	}
	defer tx.Rollback() // no-op after Commit

	var n int
	if err := tx.QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'namespaces'`).Scan(&n); err != nil {
		return false, fmt.Errorf("devstack: inspect %s: %w", dbPath, err)
	}
	if n > 0 {
		return false, nil
	}
	if err := sqliteschema.SetupSchemaOnDB(txAdminDB{ctx: ctx, tx: tx}); err != nil {
		return false, fmt.Errorf("devstack: create schema: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("devstack: create schema: %w", err)
	}
	return true, nil
}

// txAdminDB runs schema statements inside one transaction.
// sqliteschema.SetupSchemaOnDB uses only Exec; the embedded nil AdminDB is
// there to satisfy the interface, and TestRestartKeepsWorkflow fails loudly
// if a Temporal upgrade starts calling anything else.
type txAdminDB struct {
	sqlplugin.AdminDB
	ctx context.Context
	tx  *sql.Tx
}

func (a txAdminDB) Exec(stmt string, args ...any) error {
	_, err := a.tx.ExecContext(a.ctx, stmt, args...)
	return err
}

// registerNamespace adds the namespace to the database before the server
// starts, so the server's namespace registry has it from the first request.
// It does nothing when a namespace of that name exists.
func registerNamespace(cfg *config.SQL, clusterName, namespace string) error {
	ns, err := sqliteschema.NewNamespaceConfig(clusterName, namespace, false, nil)
	if err != nil {
		return fmt.Errorf("devstack: namespace %q: %w", namespace, err)
	}
	ns.Detail.Config.Retention = timestamp.DurationFromDays(retentionDays)
	if err := sqliteschema.CreateNamespaces(cfg, ns); err != nil {
		return fmt.Errorf("devstack: register namespace %q: %w", namespace, err)
	}
	return nil
}
