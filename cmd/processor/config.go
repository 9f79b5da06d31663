package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/redact"
)

// Config is the processor's configuration, parsed and validated.
type Config struct {
	DatabaseURL      string
	ConnectionString string // secret
	Namespace        string // fully qualified
	Queue            string
	Topic            string
	Subscription     string
	Consumer         string

	MaxConcurrentCalls int
	MaxLockRenewal     time.Duration
	HeartbeatInterval  time.Duration
	TakeoverAfter      time.Duration
	StaleAfter         time.Duration
	StoreTimeout       time.Duration
	SettleTimeout      time.Duration
	GracePeriod        time.Duration
	ShutdownTimeout    time.Duration
	DedupKey           string
	Key                processor.KeyFunc
	StorePayload       bool
	MaxPayloadBytes    int
	Routes             string
	EffectMaxAttempts  int
	EffectBudget       time.Duration
	HTTPAddr           string
	LogFormat          string
	LogLevel           slog.Level
}

// ConfigError names the setting that is wrong, its value (redacted when it
// is a secret) and why.
type ConfigError struct {
	Field string
	Value string
	Err   error
}

func (e *ConfigError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("%s=%q: %v", e.Field, e.Value, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// setting is one environment variable, also accepted as a flag.
type setting struct {
	env, flag, def, usage string
	secret                bool
	val                   string
}

func settings() []*setting {
	return []*setting{
		{env: "SBCLAIM_DATABASE_URL", flag: "database-url", usage: "claims database (required): sqlserver://..., postgres://... or sqlite:<path>; sqlserver URLs with fedauth=ActiveDirectoryManagedIdentity|ActiveDirectoryDefault use Entra ID", secret: true},
		{env: "SBCLAIM_SERVICEBUS_CONNECTION_STRING", flag: "servicebus-connection-string", usage: "Service Bus connection string (the emulator's works); or set SBCLAIM_SERVICEBUS_NAMESPACE", secret: true},
		{env: "SBCLAIM_SERVICEBUS_NAMESPACE", flag: "servicebus-namespace", usage: "Service Bus namespace (<name> or <name>.servicebus.windows.net), authenticated with DefaultAzureCredential (honours AZURE_CLIENT_ID)"},
		{env: "SBCLAIM_QUEUE", flag: "queue", usage: "queue to receive from; or SBCLAIM_TOPIC + SBCLAIM_SUBSCRIPTION"},
		{env: "SBCLAIM_TOPIC", flag: "topic", usage: "topic to receive from (with SBCLAIM_SUBSCRIPTION)"},
		{env: "SBCLAIM_SUBSCRIPTION", flag: "subscription", usage: "subscription of SBCLAIM_TOPIC"},
		{env: "SBCLAIM_CONSUMER", flag: "consumer", usage: "consumer name recorded in claims (required); claims are unique per message and consumer"},
		{env: "SBCLAIM_ROUTES", flag: "routes", usage: "side-effect routes file, YAML (required)"},
		{env: "SBCLAIM_MAX_CONCURRENT_CALLS", flag: "max-concurrent-calls", def: "16", usage: "messages worked on at once"},
		{env: "SBCLAIM_MAX_LOCK_RENEWAL", flag: "max-lock-renewal", def: "5m", usage: "renew each message's lock for at most this long after receipt; 0 turns renewal off"},
		{env: "SBCLAIM_HEARTBEAT_INTERVAL", flag: "heartbeat-interval", def: "30s", usage: "claim heartbeat interval (the reconciler's SBCLAIM_STALE_AFTER must be comfortably longer)"},
		{env: "SBCLAIM_TAKEOVER_AFTER", flag: "takeover-after", def: "90s", usage: "a redelivery takes a claim over, and repeats its effect with the same key, once its holder has shown no heartbeat for this long (by the database clock); at least 3 × SBCLAIM_HEARTBEAT_INTERVAL and at most SBCLAIM_STALE_AFTER"},
		{env: "SBCLAIM_STALE_AFTER", flag: "stale-after", def: "5m", usage: "the reconciler's stale window (set both apps alike); SBCLAIM_TAKEOVER_AFTER must not exceed it"},
		{env: "SBCLAIM_SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "15s", usage: "on SIGTERM, how long in-flight effects may finish; with SBCLAIM_SETTLE_TIMEOUT and SBCLAIM_STORE_TIMEOUT it must fit SBCLAIM_TERMINATION_GRACE_PERIOD"},
		{env: "SBCLAIM_STORE_TIMEOUT", flag: "store-timeout", def: "5s", usage: "timeout of each claims-store call"},
		{env: "SBCLAIM_SETTLE_TIMEOUT", flag: "settle-timeout", def: "5s", usage: "timeout of each settlement (complete, abandon, dead-letter)"},
		{env: "SBCLAIM_TERMINATION_GRACE_PERIOD", flag: "termination-grace-period", def: "30s", usage: "the platform's time between SIGTERM and SIGKILL (Container Apps' terminationGracePeriodSeconds, default 30s)"},
		{env: "SBCLAIM_DEDUP_KEY", flag: "dedup-key", def: "message-id", usage: "dedup key: message-id, property:<name>, or cloudevents (ce_source + ce_id)"},
		{env: "SBCLAIM_STORE_PAYLOAD", flag: "store-payload", def: "true", usage: "keep the body on unfinished claims so flagged claims can be redriven (turn off for PII)"},
		{env: "SBCLAIM_MAX_PAYLOAD_BYTES", flag: "max-payload-bytes", def: "262144", usage: "dead-letter bodies larger than this"},
		{env: "SBCLAIM_EFFECT_MAX_ATTEMPTS", flag: "effect-max-attempts", def: "5", usage: "attempts per effect, with the same idempotency key"},
		{env: "SBCLAIM_EFFECT_RETRY_BUDGET", flag: "effect-retry-budget", def: "2m", usage: "time budget for an effect's attempts; must be below SBCLAIM_MAX_LOCK_RENEWAL"},
		{env: "SBCLAIM_HTTP_ADDR", flag: "http-addr", def: ":8080", usage: "address of /healthz, /readyz and /metrics"},
		{env: "SBCLAIM_LOG_FORMAT", flag: "log-format", def: "json", usage: "json or text"},
		{env: "SBCLAIM_LOG_LEVEL", flag: "log-level", def: "info", usage: "debug, info, warn or error"},
	}
}

// LoadConfig reads the environment, then flags (a flag wins over its
// variable), and validates. -h prints every setting with its default.
func LoadConfig(args []string, getenv func(string) string, usageOut io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("processor", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	ss := settings()
	for _, s := range ss {
		v := getenv(s.env)
		if v == "" {
			v = s.def
		}
		s.val = v
		usage := s.env + ": " + s.usage
		def := s.def
		if s.secret && def == "" {
			usage += " (secret: never logged)"
		}
		fs.Func(s.flag, usage+defaultNote(def), func(v string) error { s.val = v; return nil })
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: processor [flags]\n\nEvery flag can also be set by its environment variable.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	vals := make(map[string]*setting, len(ss))
	for _, s := range ss {
		vals[s.env] = s
	}
	return parseConfig(vals)
}

func defaultNote(def string) string {
	if def == "" {
		return ""
	}
	return " (default " + def + ")"
}

func parseConfig(v map[string]*setting) (*Config, error) {
	var errs []error
	bad := func(field string, err error) {
		val := v[field].val
		if v[field].secret {
			val = redact.Value(val)
		}
		errs = append(errs, &ConfigError{Field: field, Value: val, Err: err})
	}
	get := func(field string) string { return strings.TrimSpace(v[field].val) }
	dur := func(field string, min time.Duration) time.Duration {
		d, err := time.ParseDuration(get(field))
		if err != nil {
			bad(field, errors.New("not a duration (examples: 30s, 5m, 1h)"))
			return 0
		}
		if d < min {
			bad(field, fmt.Errorf("must be at least %s", min))
		}
		return d
	}
	integer := func(field string, min, max int) int {
		n, err := strconv.Atoi(get(field))
		if err != nil {
			bad(field, errors.New("not an integer"))
			return 0
		}
		if n < min || n > max {
			bad(field, fmt.Errorf("must be between %d and %d", min, max))
		}
		return n
	}

	c := &Config{
		DatabaseURL:      get("SBCLAIM_DATABASE_URL"),
		ConnectionString: get("SBCLAIM_SERVICEBUS_CONNECTION_STRING"),
		Namespace:        get("SBCLAIM_SERVICEBUS_NAMESPACE"),
		Queue:            get("SBCLAIM_QUEUE"),
		Topic:            get("SBCLAIM_TOPIC"),
		Subscription:     get("SBCLAIM_SUBSCRIPTION"),
		Consumer:         get("SBCLAIM_CONSUMER"),
		Routes:           get("SBCLAIM_ROUTES"),
		DedupKey:         get("SBCLAIM_DEDUP_KEY"),
		HTTPAddr:         get("SBCLAIM_HTTP_ADDR"),
		LogFormat:        get("SBCLAIM_LOG_FORMAT"),
	}

	switch {
	case c.DatabaseURL == "":
		bad("SBCLAIM_DATABASE_URL", errors.New("required"))
	default:
		if err := claimdb.Check(c.DatabaseURL); err != nil {
			bad("SBCLAIM_DATABASE_URL", err)
		}
	}

	switch {
	case c.ConnectionString == "" && c.Namespace == "":
		bad("SBCLAIM_SERVICEBUS_CONNECTION_STRING", errors.New("set it or SBCLAIM_SERVICEBUS_NAMESPACE"))
	case c.ConnectionString != "" && c.Namespace != "":
		bad("SBCLAIM_SERVICEBUS_NAMESPACE", errors.New("set either it or SBCLAIM_SERVICEBUS_CONNECTION_STRING, not both"))
	case c.ConnectionString != "":
		if err := checkConnectionString(c.ConnectionString); err != nil {
			bad("SBCLAIM_SERVICEBUS_CONNECTION_STRING", err)
		}
	default:
		ns, err := qualifyNamespace(c.Namespace)
		if err != nil {
			bad("SBCLAIM_SERVICEBUS_NAMESPACE", err)
		}
		c.Namespace = ns
	}

	switch {
	case c.Queue != "" && (c.Topic != "" || c.Subscription != ""):
		bad("SBCLAIM_QUEUE", errors.New("set either a queue or a topic and subscription, not both"))
	case c.Queue == "" && c.Topic == "" && c.Subscription == "":
		bad("SBCLAIM_QUEUE", errors.New("set a queue, or SBCLAIM_TOPIC and SBCLAIM_SUBSCRIPTION"))
	case c.Queue == "" && c.Topic == "":
		bad("SBCLAIM_TOPIC", errors.New("required with SBCLAIM_SUBSCRIPTION"))
	case c.Queue == "" && c.Subscription == "":
		bad("SBCLAIM_SUBSCRIPTION", errors.New("required with SBCLAIM_TOPIC"))
	}

	switch {
	case c.Consumer == "":
		bad("SBCLAIM_CONSUMER", errors.New("required"))
	case len(c.Consumer) > 200:
		bad("SBCLAIM_CONSUMER", errors.New("at most 200 characters"))
	}
	if c.Routes == "" {
		bad("SBCLAIM_ROUTES", errors.New("required: the side-effect routes file"))
	}

	// Above 256, the store's connection pool (sqlstore.MaxOpenConns) would
	// make claims and heartbeats queue for connections.
	c.MaxConcurrentCalls = integer("SBCLAIM_MAX_CONCURRENT_CALLS", 1, 256)
	c.MaxLockRenewal = dur("SBCLAIM_MAX_LOCK_RENEWAL", 0)
	c.HeartbeatInterval = dur("SBCLAIM_HEARTBEAT_INTERVAL", time.Second)
	c.TakeoverAfter = dur("SBCLAIM_TAKEOVER_AFTER", time.Second)
	c.StaleAfter = dur("SBCLAIM_STALE_AFTER", time.Second)
	if floor := 3 * c.HeartbeatInterval; c.HeartbeatInterval > 0 && c.TakeoverAfter > 0 && c.TakeoverAfter < floor {
		bad("SBCLAIM_TAKEOVER_AFTER", fmt.Errorf("must be at least 3 × SBCLAIM_HEARTBEAT_INTERVAL = 3 × %s = %s: a live holder that missed two heartbeats would be taken over", c.HeartbeatInterval, floor))
	}
	if c.StaleAfter > 0 && c.TakeoverAfter > c.StaleAfter {
		bad("SBCLAIM_TAKEOVER_AFTER", fmt.Errorf("must not exceed SBCLAIM_STALE_AFTER (%s): redeliveries, which hold the message, take a silent holder's claim over before the reconciler does", c.StaleAfter))
	}
	c.ShutdownTimeout = dur("SBCLAIM_SHUTDOWN_TIMEOUT", time.Second)
	c.StoreTimeout = dur("SBCLAIM_STORE_TIMEOUT", 100*time.Millisecond)
	c.SettleTimeout = dur("SBCLAIM_SETTLE_TIMEOUT", 100*time.Millisecond)
	c.GracePeriod = dur("SBCLAIM_TERMINATION_GRACE_PERIOD", time.Second)
	if need := c.ShutdownTimeout + c.SettleTimeout + c.StoreTimeout; c.ShutdownTimeout > 0 && c.SettleTimeout > 0 && c.StoreTimeout > 0 &&
		c.GracePeriod > 0 && need >= c.GracePeriod {
		bad("SBCLAIM_SHUTDOWN_TIMEOUT", fmt.Errorf("SBCLAIM_SHUTDOWN_TIMEOUT + SBCLAIM_SETTLE_TIMEOUT + SBCLAIM_STORE_TIMEOUT = %s + %s + %s = %s must be less than SBCLAIM_TERMINATION_GRACE_PERIOD (%s): "+
			"the last effects, their outcome write and their settlement must end before the platform's SIGKILL",
			c.ShutdownTimeout, c.SettleTimeout, c.StoreTimeout, need, c.GracePeriod))
	}
	c.MaxPayloadBytes = integer("SBCLAIM_MAX_PAYLOAD_BYTES", 1, 100<<20)
	c.EffectMaxAttempts = integer("SBCLAIM_EFFECT_MAX_ATTEMPTS", 1, 100)
	c.EffectBudget = dur("SBCLAIM_EFFECT_RETRY_BUDGET", time.Millisecond)
	if c.MaxLockRenewal > 0 && c.EffectBudget >= c.MaxLockRenewal {
		bad("SBCLAIM_EFFECT_RETRY_BUDGET", fmt.Errorf("must be below SBCLAIM_MAX_LOCK_RENEWAL (%s) so retries end while the message is still locked", c.MaxLockRenewal))
	}

	switch b, err := strconv.ParseBool(get("SBCLAIM_STORE_PAYLOAD")); {
	case err != nil:
		bad("SBCLAIM_STORE_PAYLOAD", errors.New("want true or false"))
	default:
		c.StorePayload = b
	}

	key, err := processor.ParseKeySpec(c.DedupKey)
	if err != nil {
		bad("SBCLAIM_DEDUP_KEY", err)
	}
	c.Key = key

	if _, _, err := splitHostPort(c.HTTPAddr); err != nil {
		bad("SBCLAIM_HTTP_ADDR", err)
	}
	switch c.LogFormat {
	case "json", "text":
	default:
		bad("SBCLAIM_LOG_FORMAT", errors.New("want json or text"))
	}
	if err := c.LogLevel.UnmarshalText([]byte(get("SBCLAIM_LOG_LEVEL"))); err != nil {
		bad("SBCLAIM_LOG_LEVEL", errors.New("want debug, info, warn or error"))
	}

	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Entity is how claims name where the message came from.
func (c *Config) Entity() string {
	if c.Queue != "" {
		return c.Queue
	}
	return c.Topic + "/" + c.Subscription
}

func checkConnectionString(s string) error {
	var endpoint, keyName, key, sas bool
	for _, part := range strings.Split(s, ";") {
		k, v, _ := strings.Cut(part, "=")
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "endpoint":
			endpoint = strings.HasPrefix(strings.TrimSpace(v), "sb://")
		case "sharedaccesskeyname":
			keyName = v != ""
		case "sharedaccesskey":
			key = v != ""
		case "sharedaccesssignature":
			sas = v != ""
		}
	}
	switch {
	case !endpoint:
		return errors.New("needs Endpoint=sb://<host>")
	case !sas && !(keyName && key):
		return errors.New("needs SharedAccessKeyName and SharedAccessKey, or SharedAccessSignature")
	}
	return nil
}

func qualifyNamespace(ns string) (string, error) {
	ns = strings.TrimPrefix(strings.TrimPrefix(ns, "sb://"), "https://")
	ns = strings.TrimSuffix(ns, "/")
	if ns == "" || strings.ContainsAny(ns, " /:@;") {
		return "", errors.New("want <name> or <name>.servicebus.windows.net")
	}
	if !strings.Contains(ns, ".") {
		ns += ".servicebus.windows.net"
	}
	return ns, nil
}

func splitHostPort(addr string) (string, int, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", 0, errors.New("want host:port or :port")
	}
	port, err := strconv.Atoi(addr[i+1:])
	if err != nil || port < 0 || port > 65535 {
		return "", 0, errors.New("bad port")
	}
	return addr[:i], port, nil
}
