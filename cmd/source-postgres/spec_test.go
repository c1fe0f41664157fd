package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// spec: one message with a draft-07 connection specification that Airbyte's own configs satisfy,
// secrets marked, oneOf groups the platform's form can render.

// specOf runs spec with nothing around it: no config, no network, an empty environment, and a
// working directory it cannot write.
func specOf(t *testing.T) (map[string]any, []byte) {
	t.Helper()
	cmd := exec.Command(binPath, "spec")
	cmd.Env = []string{}
	cmd.Dir = "/"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	require.Len(t, lines, 1, "spec prints exactly one line")
	validate(t, "AirbyteMessage", []byte(lines[0]))
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &m))
	return m, []byte(lines[0])
}

// connSpec returns the connectionSpecification.
func connSpec(t *testing.T) map[string]any {
	m, _ := specOf(t)
	return m["spec"].(map[string]any)["connectionSpecification"].(map[string]any)
}

func TestSpecIsOneMessageWithADraft07Schema(t *testing.T) {
	m, _ := specOf(t)
	require.Equal(t, "SPEC", m["type"])
	cs := m["spec"].(map[string]any)["connectionSpecification"]
	b, _ := json.Marshal(cs)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	require.NoError(t, c.AddResource("spec.json", doc))
	_, err = c.Compile("spec.json")
	require.NoError(t, err, "connectionSpecification is a valid draft-07 schema")
	require.Equal(t, "http://json-schema.org/draft-07/schema#", cs.(map[string]any)["$schema"])
}

func TestProtocolVersionFirst(t *testing.T) {
	m, _ := specOf(t)
	pv, _ := m["spec"].(map[string]any)["protocol_version"].(string)
	require.True(t, strings.HasPrefix(pv, "0."), "protocol_version %q", pv)
}

// walk calls fn for every property schema of the spec, with its name and path.
func walk(s map[string]any, path string, fn func(name, path string, prop map[string]any)) {
	if props, ok := s["properties"].(map[string]any); ok {
		for name, p := range props {
			pm := p.(map[string]any)
			fn(name, path+"."+name, pm)
			walk(pm, path+"."+name, fn)
		}
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		if vs, ok := s[kw].([]any); ok {
			for i, v := range vs {
				walk(v.(map[string]any), path+"["+kw+"]"+string(rune('0'+i)), fn)
			}
		}
	}
	if items, ok := s["items"].(map[string]any); ok {
		walk(items, path+"[]", fn)
	}
}

// secretName is the acceptance tests' rule for names of secret fields (CAT TestSpec).
var secretName = regexp.MustCompile(`(^|_)(password|token|secret|key|credentials|certificate|jwt|access_token|refresh_token|api_token|service_account|service_account_info|tenant_id|app_id|appid|client_token|client_secret)$`)

func TestSpecRequiredFieldsAndSecrets(t *testing.T) {
	cs := connSpec(t)
	required := cs["required"].([]any)
	for _, k := range []string{"host", "port", "database", "username"} {
		require.Contains(t, required, k)
	}
	secrets := 0
	walk(cs, "", func(name, path string, p map[string]any) {
		secret, _ := p["airbyte_secret"].(bool)
		typ, _ := p["type"].(string)
		_, isConst := p["const"]
		looksSecret := secretName.MatchString(name) && !isConst && (typ == "string" || typ == "integer" || typ == "number")
		if looksSecret {
			require.True(t, secret, "%s looks secret but has no airbyte_secret", path)
			secrets++
		} else {
			require.False(t, secret, "%s carries airbyte_secret but is not a secret", path)
		}
	})
	require.GreaterOrEqual(t, secrets, 6, "password, certificates, keys and the tunnel password are secret")
}

func TestSpecOneOfGroupsHaveOneConstDiscriminator(t *testing.T) {
	cs := connSpec(t)
	groups := 0
	var check func(s map[string]any, path string)
	check = func(s map[string]any, path string) {
		if variants, ok := s["oneOf"].([]any); ok {
			groups++
			require.Equal(t, "object", s["type"], "%s: a oneOf parent has type object", path)
			var common map[string]bool
			for _, v := range variants {
				props := v.(map[string]any)["properties"].(map[string]any)
				consts := map[string]bool{}
				for name, p := range props {
					if _, ok := p.(map[string]any)["const"]; ok {
						consts[name] = true
					}
				}
				if common == nil {
					common = consts
				} else {
					for k := range common {
						if !consts[k] {
							delete(common, k)
						}
					}
				}
			}
			require.Len(t, common, 1, "%s: exactly one const discriminator shared by every variant", path)
			for name := range common {
				seen := map[any]bool{}
				for _, v := range variants {
					d := v.(map[string]any)["properties"].(map[string]any)[name].(map[string]any)
					require.NotContains(t, d, "default", "%s.%s: a discriminator has no default", path, name)
					require.NotContains(t, d, "enum", "%s.%s: a discriminator has no enum", path, name)
					require.False(t, seen[d["const"]], "%s.%s: discriminator values differ", path, name)
					seen[d["const"]] = true
				}
			}
		}
		if props, ok := s["properties"].(map[string]any); ok {
			for name, p := range props {
				check(p.(map[string]any), path+"."+name)
			}
		}
	}
	check(cs, "")
	require.Equal(t, 3, groups, "ssl_mode, replication_method and tunnel_method")
}

func TestSpecNoForbiddenKeywords(t *testing.T) {
	_, raw := specOf(t)
	var doc any
	require.NoError(t, json.Unmarshal(raw, &doc))
	var visit func(v any, path string)
	visit = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				switch k {
				case "allOf", "not", "anyOf", "if", "then", "else", "patternProperties", "$ref", "prefixItems", "dependentSchemas", "dependentRequired":
					t.Errorf("%s has %s", path, k)
				case "additionalProperties":
					require.Equal(t, true, c, "%s: additionalProperties must be true", path)
				case "enum":
					vals := c.([]any)
					for i := range vals {
						require.False(t, slices.Contains(vals[:i], vals[i]), "%s: duplicate enum value %v", path, vals[i])
					}
				}
				visit(c, path+"."+k)
			}
		case []any:
			for _, c := range v {
				visit(c, path+"[]")
			}
		}
	}
	visit(doc, "spec")
}

// airbyteConfig is a config written for Airbyte's own source-postgres: every key of its spec.
const airbyteConfig = `{
  "host": "db.example.com", "port": 5432, "database": "app", "schemas": ["public", "sales"],
  "username": "airbyte", "password": "hunter2hunter2", "jdbc_url_params": "connectTimeout=30&ApplicationName=ab",
  "ssl_mode": {"mode": "verify-full", "ca_certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
               "client_certificate": "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----",
               "client_key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----", "client_key_password": "kp"},
  "replication_method": {"method": "CDC", "plugin": "pgoutput", "replication_slot": "airbyte_slot", "publication": "airbyte_publication",
               "initial_waiting_seconds": 1200, "queue_size": 10000, "lsn_commit_behaviour": "After loading Data in the destination",
               "heartbeat_action_query": "", "invalid_cdc_cursor_position_behavior": "Fail sync", "initial_load_timeout_hours": 8,
               "debezium_shutdown_timeout_seconds": 60},
  "tunnel_method": {"tunnel_method": "SSH_KEY_AUTH", "tunnel_host": "bastion.example.com", "tunnel_port": 22, "tunnel_user": "ec2-user",
               "ssh_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----"},
  "checkpoint_target_interval_seconds": 300, "max_db_connections": 4, "check_privileges": true
}`

// compiledSpec compiles the connection specification cs as the draft-07 schema configs are
// validated against.
func compiledSpec(t *testing.T, cs map[string]any) *jsonschema.Schema {
	t.Helper()
	b, _ := json.Marshal(cs)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	require.NoError(t, c.AddResource("spec.json", doc))
	schema, err := c.Compile("spec.json")
	require.NoError(t, err)
	return schema
}

func TestSpecAcceptsAirbyteConfigs(t *testing.T) {
	cs := connSpec(t)
	schema := compiledSpec(t, cs)
	for name, cfg := range map[string]string{
		"full":     airbyteConfig,
		"minimal":  `{"host":"h","port":5432,"database":"d","username":"u","password":"p","replication_method":{"method":"CDC","replication_slot":"s","publication":"p"}}`,
		"standard": `{"host":"h","port":5432,"database":"d","username":"u","ssl_mode":{"mode":"prefer"},"replication_method":{"method":"Standard"},"tunnel_method":{"tunnel_method":"NO_TUNNEL"}}`,
		"password": `{"host":"h","port":5432,"database":"d","username":"u","tunnel_method":{"tunnel_method":"SSH_PASSWORD_AUTH","tunnel_host":"b","tunnel_port":22,"tunnel_user":"u","tunnel_user_password":"pw"}}`,
	} {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(cfg))
		require.NoError(t, err)
		require.NoError(t, schema.Validate(v), "config %s", name)
		// The connector takes it as it is.
		path := t.TempDir() + "/config.json"
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
		got, err := loadConfig(path)
		require.NoError(t, err, "config %s", name)
		require.NotEmpty(t, got.Host)
	}
	// The Kotlin spelling of the verify modes is accepted too.
	path := t.TempDir() + "/config.json"
	require.NoError(t, os.WriteFile(path, []byte(`{"host":"h","port":5432,"database":"d","username":"u","ssl_mode":{"mode":"verify_ca","ca_certificate":"x"},"replication_method":{"method":"CDC","replication_slot":"s","publication":"p"}}`), 0o600))
	got, err := loadConfig(path)
	require.NoError(t, err)
	require.Equal(t, "verify-ca", got.SSLMode.Mode)
}

// TestSpecMatchesConfig: every key the spec offers is a key the config reads, and the other way
// round, so that no option is documented and ignored or read and undocumented.
func TestSpecMatchesConfig(t *testing.T) {
	cs := connSpec(t)
	spec := map[string]bool{}
	walk(cs, "", func(name, path string, _ map[string]any) {
		spec[strings.TrimPrefix(regexp.MustCompile(`\[oneOf\]\d`).ReplaceAllString(path, ""), ".")] = true
	})
	read := map[string]bool{}
	fields := func(prefix string, v any) {
		b, _ := json.Marshal(v)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		for k := range m {
			read[prefix+k] = true
		}
	}
	fields("", config{})
	fields("ssl_mode.", sslMode{})
	fields("tunnel_method.", tunnelMethod{})
	fields("replication_method.", replicationMethod{})
	// Keys of Airbyte's spec Tidemark accepts without reading (docs/airbyte.md says why).
	for _, k := range []string{"replication_method.initial_waiting_seconds", "replication_method.queue_size", "replication_method.debezium_shutdown_timeout_seconds"} {
		read[k] = true
	}
	for k := range spec {
		require.True(t, read[k], "the spec offers %s, which the config does not read", k)
	}
	for k := range read {
		require.True(t, spec[k], "the config reads %s, which the spec does not document", k)
	}
}

// TestSpecLimitsAsAirbytes: the spec enforces no limit that Airbyte's own spec does not, so that
// every config its form takes is taken here (the connector then says, with a config_error, what
// it cannot use): the CDC timing keys' bounds are form hints (min, max) as in Airbyte's spec, not
// JSON Schema's minimum and maximum; checkpoint_target_interval_seconds has no maximum; port is 0
// to 65536. The defaults are Airbyte's: ssl_mode require, checkpoint_target_interval_seconds 300.
func TestSpecLimitsAsAirbytes(t *testing.T) {
	cs := connSpec(t)
	schema := compiledSpec(t, cs)
	for name, cfg := range map[string]string{
		"timings":    `{"host":"h","port":5432,"database":"d","username":"u","replication_method":{"method":"CDC","replication_slot":"s","publication":"p","initial_waiting_seconds":3600,"queue_size":20000,"initial_load_timeout_hours":48,"debezium_shutdown_timeout_seconds":7200}}`,
		"checkpoint": `{"host":"h","port":5432,"database":"d","username":"u","checkpoint_target_interval_seconds":172800}`,
		"port":       `{"host":"h","port":65536,"database":"d","username":"u"}`,
	} {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(cfg))
		require.NoError(t, err)
		require.NoError(t, schema.Validate(v), "config %s: Airbyte's form takes it", name)
	}
	props := cs["properties"].(map[string]any)
	require.Equal(t, "require", props["ssl_mode"].(map[string]any)["default"])
	require.Equal(t, float64(300), props["checkpoint_target_interval_seconds"].(map[string]any)["default"])
}

// TestCDCColumnsTypedAsAirbytes: the CDC columns have the types Airbyte's connector gives them
// (_ab_cdc_lsn a number, the two times plain strings, no date-time format), so a connection
// switched from it keeps its destination's column types.
func TestCDCColumnsTypedAsAirbytes(t *testing.T) {
	e := ordersEnv(t, 1)
	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	cats := r.ofType("CATALOG")
	require.Len(t, cats, 1)
	streams := cats[0].get("catalog", "streams").([]any)
	require.Len(t, streams, 1)
	props := streams[0].(map[string]any)["json_schema"].(map[string]any)["properties"].(map[string]any)
	require.Equal(t, []any{"null", "number"}, props["_ab_cdc_lsn"].(map[string]any)["type"])
	for _, col := range []string{"_ab_cdc_updated_at", "_ab_cdc_deleted_at"} {
		require.Equal(t, map[string]any{"type": []any{"null", "string"}}, props[col], col)
	}
}
