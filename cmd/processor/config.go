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

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/settings"
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
	// Sessions is how many sessions of a session-enabled entity are
	// worked at once (0: the entity has no sessions).
	Sessions           int
	SessionIdleTimeout time.Duration
	MaxLockRenewal     time.Duration
	LockDuration       time.Duration // the entity's; checked when renewal is off
	HeartbeatInterval  time.Duration
	TakeoverAfter      time.Duration
	StaleAfter         time.Duration
	StoreTimeout       time.Duration
	SettleTimeout      time.Duration
	GracePeriod        time.Duration
	ShutdownTimeout    time.Duration
	DedupKey           string
	Key                sbclaim.DedupKeyFunc
	StorePayload       bool
	MaxPayloadBytes    int
	// Delayed retries (the routes file's backoff per route).
	// MaxDeliveryCount is 0 when SBCLAIM_MAX_DELIVERY_COUNT is unset (the
	// entity's is read at start, see resolveMaxDeliveryCount).
	MaxDeliveryCount  int
	DeferPollInterval time.Duration
	DeferGrace        time.Duration
	Deferral          bool
	Routes            string
	EffectMaxAttempts int
	EffectBudget      time.Duration
	// GroupCommit and the three after it tune the group commit of outcome
	// writes (see internal/groupcommit).
	GroupCommit            bool
	GroupCommitMaxBatch    int
	GroupCommitMaxInFlight int
	GroupCommitWindow      time.Duration
	HTTPAddr               string
	LogFormat              string
	LogLevel               slog.Level
}

// ConfigError names the setting that is wrong, its value (redacted when it
// is a secret) and why.
type ConfigError = settings.Error

// configSettings lists every variable, in the order -h prints them, bound
// to c.
func configSettings(c *Config) []settings.Setting {
	return []settings.Setting{
		{Env: "SBCLAIM_DATABASE_URL", Flag: "database-url", Secret: true,
			Usage: "claims database (required): sqlserver://..., postgres://... or sqlite:<path>; sqlserver URLs with fedauth=ActiveDirectoryManagedIdentity|ActiveDirectoryDefault use Entra ID",
			Parse: func(v string) error {
				if v == "" {
					return errors.New("required")
				}
				c.DatabaseURL = v
				return sbclaim.CheckStoreURL(v)
			}},
		{Env: "SBCLAIM_SERVICEBUS_CONNECTION_STRING", Flag: "servicebus-connection-string", Secret: true,
			Usage: "Service Bus connection string (the emulator's works); or set SBCLAIM_SERVICEBUS_NAMESPACE",
			Parse: func(v string) error {
				c.ConnectionString = v
				if v == "" {
					return nil
				}
				return checkConnectionString(v)
			}},
		{Env: "SBCLAIM_SERVICEBUS_NAMESPACE", Flag: "servicebus-namespace",
			Usage: "Service Bus namespace (<name> or <name>.servicebus.windows.net), authenticated with DefaultAzureCredential (honours AZURE_CLIENT_ID)",
			Parse: func(v string) error {
				if v == "" {
					return nil
				}
				ns, err := qualifyNamespace(v)
				c.Namespace = ns
				return err
			}},
		settings.String("SBCLAIM_QUEUE", "queue", "", "queue to receive from; or SBCLAIM_TOPIC + SBCLAIM_SUBSCRIPTION", &c.Queue),
		settings.String("SBCLAIM_TOPIC", "topic", "", "topic to receive from (with SBCLAIM_SUBSCRIPTION)", &c.Topic),
		settings.String("SBCLAIM_SUBSCRIPTION", "subscription", "", "subscription of SBCLAIM_TOPIC", &c.Subscription),
		{Env: "SBCLAIM_CONSUMER", Flag: "consumer",
			Usage: "consumer name recorded in claims (required); claims are unique per message and consumer",
			Parse: func(v string) error {
				switch {
				case v == "":
					return errors.New("required")
				case len(v) > 200:
					return errors.New("at most 200 characters")
				}
				c.Consumer = v
				return nil
			}},
		{Env: "SBCLAIM_ROUTES", Flag: "routes", Usage: "side-effect routes file, YAML (required)",
			Parse: func(v string) error {
				if v == "" {
					return errors.New("required: the side-effect routes file")
				}
				c.Routes = v
				return nil
			}},
		// Above 256, the store's connection pool (sqlstore.MaxOpenConns)
		// would make claims and heartbeats queue for connections.
		settings.Int("SBCLAIM_MAX_CONCURRENT_CALLS", "max-concurrent-calls", "16", "messages worked on at once", 1, 256, &c.MaxConcurrentCalls),
		settings.Int("SBCLAIM_SESSIONS", "sessions", "0", "for a session-enabled queue or subscription (requiresSession): how many sessions are worked at once, each one message at a time, in order (docs/sessions.md); 0: the entity has no sessions", 0, 256, &c.Sessions),
		settings.Duration("SBCLAIM_SESSION_IDLE_TIMEOUT", "session-idle-timeout", "1m", "with SBCLAIM_SESSIONS, release a session that had no message for this long so that another can be accepted", time.Second, &c.SessionIdleTimeout),
		settings.Duration("SBCLAIM_MAX_LOCK_RENEWAL", "max-lock-renewal", "5m", "renew each message's lock for at most this long after receipt; 0 turns renewal off; must exceed SBCLAIM_TAKEOVER_AFTER + SBCLAIM_HEARTBEAT_INTERVAL (a redelivery watches a silent holder's claim only this long)", 0, &c.MaxLockRenewal),
		settings.Duration("SBCLAIM_LOCK_DURATION", "lock-duration", "1m", "the entity's lock duration (Service Bus default 1m, at most 5m); with lock renewal off, minus SBCLAIM_SETTLE_TIMEOUT it must exceed SBCLAIM_TAKEOVER_AFTER + SBCLAIM_HEARTBEAT_INTERVAL", time.Second, &c.LockDuration),
		settings.Duration("SBCLAIM_HEARTBEAT_INTERVAL", "heartbeat-interval", "30s", "claim heartbeat interval (the reconciler's SBCLAIM_STALE_AFTER must be comfortably longer)", time.Second, &c.HeartbeatInterval),
		settings.Duration("SBCLAIM_TAKEOVER_AFTER", "takeover-after", "90s", "a redelivery takes a claim over, and repeats its effect with the same key, once its holder has shown no heartbeat for this long (by the database clock); at least 3 × SBCLAIM_HEARTBEAT_INTERVAL and at most SBCLAIM_STALE_AFTER", time.Second, &c.TakeoverAfter),
		settings.Duration("SBCLAIM_STALE_AFTER", "stale-after", "5m", "the reconciler's stale window (set both apps alike); SBCLAIM_TAKEOVER_AFTER must not exceed it", time.Second, &c.StaleAfter),
		settings.Duration("SBCLAIM_SHUTDOWN_TIMEOUT", "shutdown-timeout", "15s", "on SIGTERM, how long in-flight effects may finish; with SBCLAIM_SETTLE_TIMEOUT and SBCLAIM_STORE_TIMEOUT it must fit SBCLAIM_TERMINATION_GRACE_PERIOD", time.Second, &c.ShutdownTimeout),
		settings.Duration("SBCLAIM_STORE_TIMEOUT", "store-timeout", "5s", "timeout of each claims-store call", 100*time.Millisecond, &c.StoreTimeout),
		settings.Duration("SBCLAIM_SETTLE_TIMEOUT", "settle-timeout", "5s", "timeout of each settlement (complete, abandon, dead-letter)", 100*time.Millisecond, &c.SettleTimeout),
		settings.Duration("SBCLAIM_TERMINATION_GRACE_PERIOD", "termination-grace-period", "30s", "the platform's time between SIGTERM and SIGKILL (Container Apps' terminationGracePeriodSeconds, default 30s)", time.Second, &c.GracePeriod),
		{Env: "SBCLAIM_DEDUP_KEY", Flag: "dedup-key", Default: "message-id",
			Usage: "dedup key: message-id, property:<name>, or cloudevents (ce_source + ce_id)",
			Parse: func(v string) error {
				key, err := sbclaim.ParseDedupKey(v)
				c.DedupKey, c.Key = v, key
				return err
			}},
		settings.Bool("SBCLAIM_STORE_PAYLOAD", "store-payload", "true", "keep the body on unfinished claims so flagged claims can be redriven (turn off for PII)", &c.StorePayload),
		settings.Int("SBCLAIM_MAX_PAYLOAD_BYTES", "max-payload-bytes", "262144", "dead-letter bodies larger than this", 1, 100<<20, &c.MaxPayloadBytes),
		settings.Bool("SBCLAIM_DEFERRAL", "deferral", "true", "delayed retries: a request the downstream did not perform is retried later (the routes file's backoff) by deferring the message, instead of abandoning it (an immediate redelivery that burns a delivery)", &c.Deferral),
		{Env: "SBCLAIM_MAX_DELIVERY_COUNT", Flag: "max-delivery-count",
			Usage: "the entity's MaxDeliveryCount: a message whose deliveries are nearly spent is not deferred again; its claim is handed to the reconciler with its stored payload. " +
				"At start the processor reads the entity's value where its identity may (Manage rights): it refuses to start when this differs, and uses the entity's when this is unset; " +
				"when it cannot read it, it warns and assumes this (unset: 10)",
			Parse: func(v string) error {
				if v == "" {
					c.MaxDeliveryCount = 0 // read from the entity, else the default
					return nil
				}
				n, err := strconv.Atoi(v)
				switch {
				case err != nil:
					return errors.New("not an integer (leave it unset to use the entity's)")
				case n < 1 || n > 2000:
					return errors.New("must be between 1 and 2000")
				}
				c.MaxDeliveryCount = n
				return nil
			}},
		settings.Duration("SBCLAIM_DEFER_POLL_INTERVAL", "defer-poll-interval", "5s", "how often the processor looks for claims whose deferred message is due", 10*time.Millisecond, &c.DeferPollInterval),
		settings.Duration("SBCLAIM_DEFER_GRACE", "defer-grace", "1h", "how long past its due time the reconciler leaves a deferred claim to its message before recovering it from the stored payload", time.Second, &c.DeferGrace),
		settings.Int("SBCLAIM_EFFECT_MAX_ATTEMPTS", "effect-max-attempts", strconv.Itoa(sbclaim.DefaultEffectMaxAttempts), "attempts per effect, with the same idempotency key", 1, 100, &c.EffectMaxAttempts),
		settings.Duration("SBCLAIM_EFFECT_RETRY_BUDGET", "effect-retry-budget", sbclaim.DefaultRetryBudget.String(), "time budget for an effect's attempts (the library's default too); a longer outage is carried by delayed retries; must be below SBCLAIM_MAX_LOCK_RENEWAL", time.Millisecond, &c.EffectBudget),
		settings.Bool("SBCLAIM_GROUP_COMMIT", "group-commit", "true", "write the outcomes (processed, released, attempts, heartbeats) of messages finishing together in one statement and one commit; a lone write is never delayed", &c.GroupCommit),
		settings.Int("SBCLAIM_GROUP_COMMIT_MAX_BATCH", "group-commit-max-batch", strconv.Itoa(sbclaim.DefaultGroupCommitMaxBatch), "outcome writes per batch at most", 1, sbclaim.MaxGroupCommitBatch, &c.GroupCommitMaxBatch),
		settings.Int("SBCLAIM_GROUP_COMMIT_MAX_IN_FLIGHT", "group-commit-max-in-flight", strconv.Itoa(sbclaim.DefaultGroupCommitMaxInFlight), "outcome batches written at once; a write waits only while this many are being written", 1, 16, &c.GroupCommitMaxInFlight),
		settings.Duration("SBCLAIM_GROUP_COMMIT_WINDOW", "group-commit-window", "0s", "how long a batch that starts while another is being written waits for more writes (0: none; at most 1s)", 0, &c.GroupCommitWindow),
		{Env: "SBCLAIM_HTTP_ADDR", Flag: "http-addr", Default: ":8080", Usage: "address of /healthz, /readyz and /metrics",
			Parse: func(v string) error {
				c.HTTPAddr = v
				_, _, err := splitHostPort(v)
				return err
			}},
		settings.OneOf("SBCLAIM_LOG_FORMAT", "log-format", "json", "json or text", &c.LogFormat, "json", "text"),
		{Env: "SBCLAIM_LOG_LEVEL", Flag: "log-level", Default: "info", Usage: "debug, info, warn or error",
			Parse: func(v string) error {
				if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
					return errors.New("want debug, info, warn or error")
				}
				return nil
			}},
	}
}

// LoadConfig reads the environment, then flags (a flag wins over its
// variable), and validates. -h prints every setting with the value it
// will take.
func LoadConfig(args []string, getenv func(string) string, usageOut io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("processor", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	c := &Config{}
	v := settings.Bind(fs, getenv, configSettings(c))
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
	if err := v.Load(); err != nil {
		return nil, err
	}
	if err := c.validate(v); err != nil {
		return nil, err
	}
	return c, nil
}

// validate checks the rules between settings, reporting each as a
// *ConfigError about the setting to change.
func (c *Config) validate(v *settings.Values) error {
	var errs []error
	bad := func(env, format string, args ...any) { errs = append(errs, v.Errorf(env, format, args...)) }

	switch {
	case c.ConnectionString == "" && c.Namespace == "":
		bad("SBCLAIM_SERVICEBUS_CONNECTION_STRING", "set it or SBCLAIM_SERVICEBUS_NAMESPACE")
	case c.ConnectionString != "" && c.Namespace != "":
		bad("SBCLAIM_SERVICEBUS_NAMESPACE", "set either it or SBCLAIM_SERVICEBUS_CONNECTION_STRING, not both")
	}
	switch {
	case c.Queue != "" && (c.Topic != "" || c.Subscription != ""):
		bad("SBCLAIM_QUEUE", "set either a queue or a topic and subscription, not both")
	case c.Queue == "" && c.Topic == "" && c.Subscription == "":
		bad("SBCLAIM_QUEUE", "set a queue, or SBCLAIM_TOPIC and SBCLAIM_SUBSCRIPTION")
	case c.Queue == "" && c.Topic == "":
		bad("SBCLAIM_TOPIC", "required with SBCLAIM_SUBSCRIPTION")
	case c.Queue == "" && c.Subscription == "":
		bad("SBCLAIM_SUBSCRIPTION", "required with SBCLAIM_TOPIC")
	}
	if c.Sessions > 0 && c.MaxLockRenewal == 0 {
		bad("SBCLAIM_SESSIONS", "needs lock renewal (SBCLAIM_MAX_LOCK_RENEWAL is 0): a session is held across its messages by renewing its lock")
	}
	if floor := 3 * c.HeartbeatInterval; c.TakeoverAfter < floor {
		bad("SBCLAIM_TAKEOVER_AFTER", "must be at least 3 × SBCLAIM_HEARTBEAT_INTERVAL = 3 × %s = %s: a live holder that missed two heartbeats would be taken over", c.HeartbeatInterval, floor)
	}
	if c.TakeoverAfter > c.StaleAfter {
		bad("SBCLAIM_TAKEOVER_AFTER", "must not exceed SBCLAIM_STALE_AFTER (%s): redeliveries, which hold the message, take a silent holder's claim over before the reconciler does", c.StaleAfter)
	}
	if need := c.ShutdownTimeout + c.SettleTimeout + c.StoreTimeout; need >= c.GracePeriod {
		bad("SBCLAIM_SHUTDOWN_TIMEOUT", "SBCLAIM_SHUTDOWN_TIMEOUT + SBCLAIM_SETTLE_TIMEOUT + SBCLAIM_STORE_TIMEOUT = %s + %s + %s = %s must be less than SBCLAIM_TERMINATION_GRACE_PERIOD (%s): "+
			"the last effects, their outcome write and their settlement must end before the platform's SIGKILL",
			c.ShutdownTimeout, c.SettleTimeout, c.StoreTimeout, need, c.GracePeriod)
	}
	// A redelivery of a dead holder's message watches its claim only while
	// it holds the message: the window must outlast the take-over window
	// plus one poll (a heartbeat interval), or the message is completed
	// instead of the claim taken over (processor.Options.checkWatch).
	need := c.TakeoverAfter + c.HeartbeatInterval
	switch {
	case c.MaxLockRenewal > 0 && c.MaxLockRenewal <= need:
		bad("SBCLAIM_MAX_LOCK_RENEWAL", "must exceed SBCLAIM_TAKEOVER_AFTER + SBCLAIM_HEARTBEAT_INTERVAL = %s + %s = %s: "+
			"a redelivery watches a silent holder's claim only while it renews its message's lock, and would complete a dead holder's message instead of taking its claim over",
			c.TakeoverAfter, c.HeartbeatInterval, need)
	case c.MaxLockRenewal == 0 && c.LockDuration-c.SettleTimeout <= need:
		bad("SBCLAIM_LOCK_DURATION", "with lock renewal off (SBCLAIM_MAX_LOCK_RENEWAL=0), SBCLAIM_LOCK_DURATION - SBCLAIM_SETTLE_TIMEOUT = %s - %s = %s "+
			"must exceed SBCLAIM_TAKEOVER_AFTER + SBCLAIM_HEARTBEAT_INTERVAL = %s + %s = %s: a redelivery watches a silent holder's claim only until its lock nearly expires; "+
			"turn renewal on, lengthen the entity's lock (and set SBCLAIM_LOCK_DURATION to it) or shorten SBCLAIM_TAKEOVER_AFTER",
			c.LockDuration, c.SettleTimeout, c.LockDuration-c.SettleTimeout, c.TakeoverAfter, c.HeartbeatInterval, need)
	}
	if c.MaxLockRenewal > 0 && c.EffectBudget >= c.MaxLockRenewal {
		bad("SBCLAIM_EFFECT_RETRY_BUDGET", "must be below SBCLAIM_MAX_LOCK_RENEWAL (%s) so retries end while the message is still locked", c.MaxLockRenewal)
	}
	if c.GroupCommitWindow > time.Second {
		bad("SBCLAIM_GROUP_COMMIT_WINDOW", "at most 1s: a write may wait that long")
	}
	return errors.Join(errs...)
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
