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
		{"sync_time_budget_seconds", true},
		{"state_interval_seconds", true},
		{"replication_method.initial_load_timeout_hours", true},
	}
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
		"replication_method.debezium_shutdown_timeout_seconds", "checkpoint_target_interval_seconds", "max_db_connections"} {
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
