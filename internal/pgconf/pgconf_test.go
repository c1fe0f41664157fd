package pgconf

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestPinReplacesEverySpelling: a connection string's "timezone" (or PGTZ, which pgx maps to
// "timezone") would be sent beside the pinned "TimeZone", and the server keeps whichever it reads
// last; after Pin only the pinned spelling is left, with the pinned value.
func TestPinReplacesEverySpelling(t *testing.T) {
	t.Setenv("PGTZ", "Asia/Tokyo")
	cfg, err := pgconn.ParseConfig("postgres://u@localhost/db?timezone=America/New_York&DATESTYLE=SQL,DMY&Row_Security=on&application_name=mine")
	require.NoError(t, err)
	Pin(cfg, "tidemark")
	for k, v := range cfg.RuntimeParams {
		for name, want := range Settings {
			if strings.EqualFold(k, name) {
				require.Equal(t, name, k, "only the pinned spelling is sent")
				require.Equal(t, want, v)
			}
		}
	}
	for name := range Settings {
		require.Contains(t, cfg.RuntimeParams, name)
	}
	require.Equal(t, "mine", cfg.RuntimeParams["application_name"], "the connection string names the application")
	require.NotNil(t, cfg.AfterConnect, "every connection checks the settings")
}
