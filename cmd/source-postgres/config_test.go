package main

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// setPath sets the value at a dotted path of a config map, making the objects on the way.
func setPath(m map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}

// loadRaw writes a config document and loads it.
func loadRaw(t *testing.T, doc string) (*config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	return loadConfig(path)
}

// rangeConfig is a valid config with a tunnel, so that every numeric key is read; the value at
// path is raw JSON text.
func rangeConfig(t *testing.T, path, raw string) string {
	t.Helper()
	m := map[string]any{
		"host": "db.example.com", "port": 5432, "database": "app", "username": "u", "password": "pw",
		"replication_method": map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p"},
		"tunnel_method":      map[string]any{"tunnel_method": "SSH_PASSWORD_AUTH", "tunnel_host": "bastion", "tunnel_port": 22, "tunnel_user": "u", "tunnel_user_password": "pw"},
	}
	const marker = "__VALUE__"
	setPath(m, path, marker)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return strings.Replace(string(b), `"`+marker+`"`, raw, 1)
}

// TestConfigRanges: every numeric key of the config is range-checked, with the range the spec
// shows: an extreme value (a huge state_interval_seconds would overflow a time.Duration), a
// negative one, a fraction or a string is a config_error naming the key, never a panic or a
// silently wrong duration; the bounds themselves, and 0 where it means the default, are
// accepted and give positive durations.
func TestConfigRanges(t *testing.T) {
	cs := connSpec(t)
	bounds := map[string][2]float64{}
	walk(cs, "", func(name, path string, p map[string]any) {
		path = strings.TrimPrefix(strings.NewReplacer("[oneOf]0", "", "[oneOf]1", "", "[oneOf]2", "", "[oneOf]3", "", "[oneOf]4", "", "[oneOf]5", "").Replace(path), ".")
		lo, okLo := p["minimum"].(float64)
		hi, okHi := p["maximum"].(float64)
		if !okLo && !okHi {
			// Airbyte's form hints (not JSON Schema keywords), which the connector checks.
			lo, okLo = p["min"].(float64)
			hi, okHi = p["max"].(float64)
		}
		if typ, _ := p["type"].(string); typ == "integer" && okLo && okHi {
			if b, seen := bounds[path]; seen {
				require.Equal(t, b, [2]float64{lo, hi}, "%s has the same range in every variant", path)
			}
			bounds[path] = [2]float64{lo, hi}
		}
	})
	keys := []struct {
		path        string
		zeroDefault bool // 0 means the default
	}{
		{"port", false},
		{"tunnel_method.tunnel_port", false},
		{"backfill_chunk_size", true},
		{"backfill_readers", true},
		{"sync_time_budget_seconds", true},
		{"state_interval_seconds", true},
		{"replication_method.initial_load_timeout_hours", true},
		{"checkpoint_target_interval_seconds", true},
	}
	// Where the spec keeps Airbyte's bounds and a value inside them cannot work (a port of 0 or
	// 65536), or has none (checkpoint_target_interval_seconds: positive), the connector's own.
	bounds["port"], bounds["tunnel_method.tunnel_port"] = [2]float64{1, 65535}, [2]float64{1, 65535}
	bounds["checkpoint_target_interval_seconds"] = [2]float64{1, math.MaxInt32}
	for _, k := range keys {
		b, ok := bounds[k.path]
		require.True(t, ok, "the spec gives %s a minimum and a maximum", k.path)
		lo, hi := int64(b[0]), int64(b[1])
		name := k.path[strings.LastIndex(k.path, ".")+1:]
		good := []int64{lo, hi}
		if k.zeroDefault {
			good = append(good, 0)
		}
		for _, v := range good {
			t.Run(k.path+"="+strconv.FormatInt(v, 10), func(t *testing.T) {
				c, err := loadRaw(t, rangeConfig(t, k.path, strconv.FormatInt(v, 10)))
				require.NoError(t, err)
				require.Positive(t, c.budget())
				require.Positive(t, c.stateInterval())
			})
		}
		bad := []string{strconv.FormatInt(hi+1, 10), strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MinInt64, 10),
			"-1", "9223372036854775808", "1e30", "1.5", `"10"`, "true"}
		if lo-1 != 0 || !k.zeroDefault {
			bad = append(bad, strconv.FormatInt(lo-1, 10))
		}
		for _, raw := range bad {
			t.Run(k.path+"="+raw, func(t *testing.T) {
				_, err := loadRaw(t, rangeConfig(t, k.path, raw))
				var ce *configError
				require.True(t, errors.As(err, &ce), "a config_error: %v", err)
				require.ErrorContains(t, err, name)
				require.NotContains(t, err.Error(), "pw")
			})
		}
	}

	// Keys of Airbyte's spec that Tidemark accepts without reading take any number.
	for _, path := range []string{"replication_method.initial_waiting_seconds", "replication_method.queue_size",
		"replication_method.debezium_shutdown_timeout_seconds"} {
		for _, raw := range []string{strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MinInt64, 10), "1e300"} {
			_, err := loadRaw(t, rangeConfig(t, path, raw))
			require.NoError(t, err, "%s=%s", path, raw)
		}
	}

	// jdbc_url_params' connectTimeout becomes libpq's connect_timeout, in seconds.
	for _, v := range []string{"0", "3600"} {
		_, err := loadRaw(t, rangeConfig(t, "jdbc_url_params", `"connectTimeout=`+v+`"`))
		require.NoError(t, err, v)
	}
	for _, v := range []string{"-1", "3601", "9223372036854775807", "99999999999999999999", "1.5"} {
		_, err := loadRaw(t, rangeConfig(t, "jdbc_url_params", `"connectTimeout=`+v+`"`))
		var ce *configError
		require.True(t, errors.As(err, &ce), "connectTimeout=%s: %v", v, err)
		require.ErrorContains(t, err, "connectTimeout")
	}
}

// TestValueForms: value_forms defaults to airbyte; exact is accepted; anything else is a config
// error naming the key and its values.
func TestValueForms(t *testing.T) {
	base := `{"host":"h","port":5432,"database":"d","username":"u","replication_method":{"method":"CDC","replication_slot":"s","publication":"p"}`
	c, err := loadRaw(t, base+`}`)
	require.NoError(t, err)
	require.Equal(t, "airbyte", c.profile().String())
	c, err = loadRaw(t, base+`,"value_forms":"exact"}`)
	require.NoError(t, err)
	require.Equal(t, "exact", c.profile().String())
	_, err = loadRaw(t, base+`,"value_forms":"base64"}`)
	require.Error(t, err)
	var ce *configError
	require.True(t, errors.As(err, &ce))
	require.Contains(t, err.Error(), `value_forms "base64"`)
	require.Contains(t, err.Error(), "exact")
}

// TestAirbyteKeysHonouredOrRefused: the keys of Airbyte's spec that Tidemark has no feature of its
// own for are honoured (the legacy ssl flag, checkpoint_target_interval_seconds,
// max_db_connections) or refused with a config error that names the key (Entra service principal
// authentication), never accepted and ignored; and create_replication_slot is off by default, as
// Airbyte's connector never creates a slot.
func TestAirbyteKeysHonouredOrRefused(t *testing.T) {
	base := func(edit func(m map[string]any)) string {
		m := map[string]any{
			"host": "db.example.com", "port": 5432, "database": "app", "username": "u", "password": "pw",
			"replication_method": map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p"},
		}
		edit(m)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	load := func(edit func(m map[string]any)) (*config, error) {
		return loadRaw(t, base(edit))
	}
	refused := func(err error, words ...string) {
		t.Helper()
		var ce *configError
		require.True(t, errors.As(err, &ce), "a config_error: %v", err)
		for _, w := range words {
			require.ErrorContains(t, err, w)
		}
	}

	// The legacy ssl flag: the mode it stands for when ssl_mode is absent, refused when it
	// contradicts ssl_mode.
	c, err := load(func(m map[string]any) { m["ssl"] = true })
	require.NoError(t, err)
	require.Equal(t, "require", c.SSLMode.Mode)
	c, err = load(func(m map[string]any) { m["ssl"] = false })
	require.NoError(t, err)
	require.Equal(t, "disable", c.SSLMode.Mode)
	c, err = load(func(m map[string]any) {
		m["ssl"] = true
		m["ssl_mode"] = map[string]any{"mode": "verify-full", "ca_certificate": "x"}
	})
	require.NoError(t, err)
	require.Equal(t, "verify-full", c.SSLMode.Mode)
	c, err = load(func(m map[string]any) { m["ssl"] = false; m["ssl_mode"] = map[string]any{"mode": "disable"} })
	require.NoError(t, err)
	require.Equal(t, "disable", c.SSLMode.Mode)
	_, err = load(func(m map[string]any) { m["ssl"] = true; m["ssl_mode"] = map[string]any{"mode": "disable"} })
	refused(err, "ssl", "ssl_mode")
	_, err = load(func(m map[string]any) { m["ssl"] = false; m["ssl_mode"] = map[string]any{"mode": "require"} })
	refused(err, "ssl", "ssl_mode")

	// Entra service principal authentication needs a token from Microsoft's identity platform,
	// which Tidemark does not fetch: refused. Without it the tenant and client ids mean nothing,
	// in Airbyte's connector too.
	_, err = load(func(m map[string]any) {
		m["entra_service_principal_auth"] = true
		m["entra_tenant_id"], m["entra_client_id"] = "tenant-0000", "client-0000"
	})
	refused(err, "entra_service_principal_auth")
	_, err = load(func(m map[string]any) {
		m["entra_service_principal_auth"] = false
		m["entra_tenant_id"], m["entra_client_id"] = "tenant-0000", "client-0000"
	})
	require.NoError(t, err)

	// max_db_connections bounds the connections a read opens at once: a CDC read needs three
	// (its queries, the engine's chunks, the replication stream), four with the heartbeat query;
	// a Standard or Xmin read one.
	for _, tc := range []struct {
		n      any
		method map[string]any
		ok     bool
	}{
		{2, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p"}, false},
		{3, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p"}, true},
		{3, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p", "heartbeat_action_query": "SELECT 1"}, false},
		{4, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p", "heartbeat_action_query": "SELECT 1"}, true},
		{1, map[string]any{"method": "Standard"}, true},
		{1, map[string]any{"method": "Xmin"}, true},
		{0, map[string]any{"method": "Xmin"}, false},
		{-1, map[string]any{"method": "Standard"}, false},
		{nil, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p"}, true},
		// Each backfill reader holds a connection of its own.
		{4, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p", "readers": 3}, false},
		{5, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p", "readers": 3}, true},
		{5, map[string]any{"method": "CDC", "replication_slot": "s", "publication": "p", "readers": 3, "heartbeat_action_query": "SELECT 1"}, false},
		{1, map[string]any{"method": "Standard", "readers": 3}, true},
	} {
		readers := tc.method["readers"]
		delete(tc.method, "readers")
		_, err := load(func(m map[string]any) {
			m["max_db_connections"] = tc.n
			m["replication_method"] = tc.method
			if readers != nil {
				m["backfill_readers"] = readers
			}
		})
		if tc.ok {
			require.NoError(t, err, "max_db_connections %v, %v", tc.n, tc.method)
		} else {
			refused(err, "max_db_connections")
		}
	}

	// checkpoint_target_interval_seconds is the state interval when state_interval_seconds is
	// absent (Airbyte's form fills in 300, so Tidemark's own key wins); it has no maximum.
	c, err = load(func(m map[string]any) { m["checkpoint_target_interval_seconds"] = 300 })
	require.NoError(t, err)
	require.Equal(t, 300*time.Second, c.stateInterval())
	c, err = load(func(m map[string]any) { m["checkpoint_target_interval_seconds"] = 7; m["state_interval_seconds"] = 7 })
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, c.stateInterval())
	c, err = load(func(m map[string]any) { m["checkpoint_target_interval_seconds"] = 300; m["state_interval_seconds"] = 5 })
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, c.stateInterval())
	c, err = load(func(m map[string]any) { m["checkpoint_target_interval_seconds"] = 172800 })
	require.NoError(t, err)
	require.Equal(t, 48*time.Hour, c.stateInterval())
	_, err = load(func(m map[string]any) { m["checkpoint_target_interval_seconds"] = -1 })
	refused(err, "checkpoint_target_interval_seconds")

	// check_privileges is accepted either way: discovery lists only what the role may read.
	for _, v := range []bool{true, false} {
		_, err = load(func(m map[string]any) { m["check_privileges"] = v })
		require.NoError(t, err)
	}

	// No slot is created unless asked for.
	c, err = load(func(m map[string]any) {})
	require.NoError(t, err)
	require.False(t, c.createSlot())
	c, err = load(func(m map[string]any) { m["create_replication_slot"] = true })
	require.NoError(t, err)
	require.True(t, c.createSlot())
}

// TestConfigDefaults: applyDefaults fills every key left out (and spells the aliases in their one
// form), each default passes the checks that follow it, and a default never hides a value given.
func TestConfigDefaults(t *testing.T) {
	c := &config{Host: "h", Database: "d", Username: "u"}
	c.applyDefaults()
	require.NoError(t, errors.Join(c.checkServer(), c.checkSSL(), c.checkTunnel(), c.checkReplication(),
		c.checkSignalTable(), c.checkIntervals(), c.checkAirbyteKeys(), c.checkJDBCParams(), c.checkValueForms()))
	require.Equal(t, 5432, *c.Port)
	require.Equal(t, []string{"public"}, c.Schemas)
	require.Equal(t, "require", c.SSLMode.Mode)
	require.Equal(t, "Standard", c.ReplicationMethod.Method)
	require.Equal(t, commitAfterLoading, c.ReplicationMethod.LSNCommitBehaviour)
	require.Equal(t, invalidCursorFail, c.ReplicationMethod.InvalidCDCCursorBehaviour)
	require.Equal(t, 8, c.ReplicationMethod.InitialLoadTimeoutHours)
	require.Equal(t, "airbyte", c.ValueForms)
	require.False(t, c.createSlot())

	off := false
	c = &config{SSL: &off, SSLMode: nil, TunnelMethod: &tunnelMethod{Method: "SSH_KEY_AUTH"},
		ReplicationMethod: &replicationMethod{}}
	c.applyDefaults()
	require.Equal(t, "disable", c.SSLMode.Mode, "the legacy ssl flag false is ssl_mode disable")
	require.Equal(t, 22, c.TunnelMethod.portNumber)
	require.Equal(t, "CDC", c.ReplicationMethod.Method, "a replication_method without a method is CDC")

	port, tport := 6543, 2222
	c = &config{Port: &port, Schemas: []string{"s"}, SSLMode: &sslMode{Mode: "verify_full"},
		TunnelMethod:      &tunnelMethod{Method: "SSH_PASSWORD_AUTH", Port: &tport},
		ReplicationMethod: &replicationMethod{Method: "Xmin", InitialLoadTimeoutHours: 5}, BackfillChunkSize: 7, ValueForms: "exact"}
	c.applyDefaults()
	require.Equal(t, 6543, *c.Port)
	require.Equal(t, []string{"s"}, c.Schemas)
	require.Equal(t, "verify-full", c.SSLMode.Mode)
	require.Equal(t, 2222, c.TunnelMethod.portNumber)
	require.Equal(t, "Xmin", c.ReplicationMethod.Method)
	require.Equal(t, 5, c.ReplicationMethod.InitialLoadTimeoutHours)
	require.Equal(t, 7, c.BackfillChunkSize)
	require.Equal(t, "exact", c.ValueForms)
}
