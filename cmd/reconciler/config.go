package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/settings"
	ops "github.com/sbclaim/sbclaim/operator"
)

// StaleFactor is how many heartbeat intervals a claim must miss before the
// reconciler may flag it. Three leaves room for one late heartbeat (a GC
// pause, a slow database) and one lost write, so a claim whose processor is
// alive and still working is not handed to operators while its effect runs.
const StaleFactor = 3

// Config is the reconciler binary's configuration. Every field comes from an
// SBCLAIM_ environment variable, which the matching flag overrides.
type Config struct {
	DatabaseURL       string
	Schedule          string
	StaleAfter        time.Duration
	HeartbeatInterval time.Duration // the processors' interval; only for validation
	Retention         time.Duration
	LockDuration      time.Duration // the entity's Service Bus lock duration
	MaxDeliveryCount  int           // the entity's max delivery count
	FlagBatchSize     int
	PurgeBatchSize    int
	PurgeMaxPerTick   int
	QueryTimeout      time.Duration
	// RoutesPath is SBCLAIM_ROUTES: one routes file for every consumer, or
	// consumer=path pairs separated by commas.
	RoutesPath          string
	RecoveryMaxAttempts int
	RecoveryBackoff     time.Duration
	RecoveryBackoffMax  time.Duration
	RecoveryConcurrency int
	Operator            string
	HTTPAddr            string
	// The operator console (console.go): its listen address, the
	// operators' identity (exactly one of: a verified OIDC token, headers
	// trusted by declaration, the local operator of local development),
	// and whether `run` serves it too.
	ConsoleAddr                 string
	ConsoleOIDCIssuer           string
	ConsoleOIDCAudience         string
	ConsoleAllowedGroups        []string
	ConsoleAllowedPrincipals    []string
	ConsoleTrustIdentityHeaders bool
	ConsoleLocalOperator        string
	RunConsole                  bool
	LogFormat                   string // json | text
	LogLevel                    slog.Level
	ShutdownTimeout             time.Duration
}

// ConfigError is an invalid setting: it names the environment variable (and
// so the flag), the bad value (redacted when secret) and what is wrong.
type ConfigError = settings.Error

// configSettings lists every variable, in the order -h prints them, bound
// to c.
func configSettings(c *Config) []settings.Setting {
	return []settings.Setting{
		{Env: "SBCLAIM_DATABASE_URL", Flag: "database-url", Secret: true,
			Usage: "claims database: sqlite:<path>, postgres://..., sqlserver://... (required)",
			Parse: func(v string) error {
				if v == "" {
					return errors.New("required")
				}
				if err := sbclaim.CheckStoreURL(v); err != nil {
					return err
				}
				c.DatabaseURL = v
				return nil
			}},
		{Env: "SBCLAIM_RECONCILE_SCHEDULE", Flag: "schedule", Default: ops.DefaultSchedule,
			Usage: `cron spec of the reconcile tick: 5 fields ("*/5 * * * *") or "@every 1m"`,
			Parse: func(v string) error {
				if err := ops.CheckSchedule(v); err != nil {
					return fmt.Errorf("invalid cron spec: %w", err)
				}
				c.Schedule = v
				return nil
			}},
		settings.Duration("SBCLAIM_STALE_AFTER", "stale-after", "5m",
			fmt.Sprintf("recover (or, when it cannot be, flag) a claim with no heartbeat, or released and not taken over, for this long; at least %d × the heartbeat interval and not less than the processors' SBCLAIM_TAKEOVER_AFTER", StaleFactor),
			time.Nanosecond, &c.StaleAfter),
		settings.Duration("SBCLAIM_HEARTBEAT_INTERVAL", "heartbeat-interval", "30s",
			"the processors' heartbeat interval: the reconciler heartbeats the claims it recovers as often, and stale-after is checked against it",
			time.Nanosecond, &c.HeartbeatInterval),
		settings.Int("SBCLAIM_RECOVERY_MAX_ATTEMPTS", "recovery-max-attempts", strconv.Itoa(ops.DefaultRecoveryMaxAttempts),
			"recovery attempts whose outcome may stay unknown before the claim is flagged for an operator",
			1, math.MaxInt, &c.RecoveryMaxAttempts),
		settings.Duration("SBCLAIM_RECOVERY_BACKOFF", "recovery-backoff", ops.DefaultRecoveryBackoff.String(),
			"wait before the next recovery attempt of a claim that recovery did not settle; doubled per attempt",
			time.Nanosecond, &c.RecoveryBackoff),
		settings.Duration("SBCLAIM_RECOVERY_BACKOFF_MAX", "recovery-backoff-max", "1h",
			"longest wait between two recovery attempts of a claim",
			time.Nanosecond, &c.RecoveryBackoffMax),
		settings.Int("SBCLAIM_RECOVERY_CONCURRENCY", "recovery-concurrency", strconv.Itoa(ops.DefaultRecoveryConcurrency),
			"effects the recovery pass runs at once",
			1, math.MaxInt, &c.RecoveryConcurrency),
		settings.Duration("SBCLAIM_RETENTION", "retention", "168h",
			"purge finished claims older than this; at least lock duration × max delivery count",
			time.Nanosecond, &c.Retention),
		settings.Duration("SBCLAIM_LOCK_DURATION", "lock-duration", "1m",
			"the Service Bus entity's lock duration (used to validate retention)",
			time.Nanosecond, &c.LockDuration),
		settings.Int("SBCLAIM_MAX_DELIVERY_COUNT", "max-delivery-count", "10",
			"the Service Bus entity's max delivery count (used to validate retention)",
			1, math.MaxInt, &c.MaxDeliveryCount),
		settings.Int("SBCLAIM_FLAG_BATCH_SIZE", "flag-batch-size", strconv.Itoa(ops.DefaultFlagBatchSize),
			"claims flagged per query; the flag pass loops until a batch is short",
			1, math.MaxInt, &c.FlagBatchSize),
		settings.Int("SBCLAIM_PURGE_BATCH_SIZE", "purge-batch-size", strconv.Itoa(ops.DefaultPurgeBatchSize),
			"claims deleted per DELETE; the purge pass loops until a batch is short",
			1, math.MaxInt, &c.PurgeBatchSize),
		settings.Int("SBCLAIM_PURGE_MAX_PER_TICK", "purge-max-per-tick", strconv.Itoa(ops.DefaultMaxPurgePerTick),
			"at most this many claims deleted per tick (a backlog is worked off over several ticks)",
			1, math.MaxInt, &c.PurgeMaxPerTick),
		settings.Duration("SBCLAIM_QUERY_TIMEOUT", "query-timeout", "30s",
			"timeout of each database query",
			time.Nanosecond, &c.QueryTimeout),
		{Env: "SBCLAIM_ROUTES", Flag: "routes",
			Usage: "the processors' routes file, or consumer=path pairs separated by commas (one file per consumer); needed by recovery and redrive (without it the tick flags every stale claim)",
			Parse: func(v string) error {
				if _, err := parseRoutesSpec(v); err != nil {
					return err
				}
				c.RoutesPath = v
				return nil
			}},
		settings.String("SBCLAIM_OPERATOR", "operator", "",
			"operator name recorded on resolve/redrive (default: the OS user)",
			&c.Operator),
		settings.String("SBCLAIM_HTTP_ADDR", "http-addr", ":8081",
			"listen address of /healthz, /readyz and /metrics (empty: no HTTP server)",
			&c.HTTPAddr),
		{Env: "SBCLAIM_CONSOLE_ADDR", Flag: "console-addr", Default: ":8082",
			Usage: "listen address of the operator console (reconciler console, or run with SBCLAIM_RUN_CONSOLE=true): host:port, e.g. :8082 or 127.0.0.1:8082",
			Parse: func(v string) error {
				if err := validListenAddr(v); err != nil {
					return err
				}
				c.ConsoleAddr = v
				return nil
			}},
		{Env: "SBCLAIM_CONSOLE_OIDC_ISSUER", Flag: "console-oidc-issuer",
			Usage: "the console accepts operators whose ID token (X-MS-TOKEN-AAD-ID-TOKEN from the platform's sign-in, or Authorization: Bearer) this OpenID Connect issuer signed, e.g. https://login.microsoftonline.com/<tenant-id>/v2.0; needs SBCLAIM_CONSOLE_OIDC_AUDIENCE",
			Parse: func(v string) error {
				if v == "" {
					return nil
				}
				if err := validIssuer(v); err != nil {
					return err
				}
				c.ConsoleOIDCIssuer = v
				return nil
			}},
		settings.String("SBCLAIM_CONSOLE_OIDC_AUDIENCE", "console-oidc-audience", "",
			"the audience the console's tokens must name: the app registration's client id",
			&c.ConsoleOIDCAudience),
		objectIDs("SBCLAIM_CONSOLE_ALLOWED_GROUPS", "console-allowed-groups",
			"with SBCLAIM_CONSOLE_OIDC_ISSUER: object ids (comma-separated) of the groups whose members may use the console (the token's groups claim); with SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS also empty, every verified token may",
			&c.ConsoleAllowedGroups),
		objectIDs("SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS", "console-allowed-principals",
			"with SBCLAIM_CONSOLE_OIDC_ISSUER: object ids (comma-separated) of the users who may use the console (the token's oid), besides the allowed groups",
			&c.ConsoleAllowedPrincipals),
		settings.Bool("SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS", "console-insecure-trust-identity-headers", "false",
			"INSECURE: take the operator from X-MS-CLIENT-PRINCIPAL-NAME/-ID without verifying it; only behind a front that strips and sets them, on a port nothing else reaches (anybody who reaches the port can claim to be anyone)",
			&c.ConsoleTrustIdentityHeaders),
		{Env: "SBCLAIM_CONSOLE_LOCAL_OPERATOR", Flag: "console-local-operator",
			Usage: "local development only: nobody signs in; the console records every action as this operator, \"not signed in\", and answers only requests addressed to localhost, 127.0.0.1 or [::1]",
			Parse: func(v string) error {
				if v == "" {
					return nil
				}
				if err := console.ValidOperatorName(v); err != nil {
					return err
				}
				c.ConsoleLocalOperator = v
				return nil
			}},
		{Env: "SBCLAIM_RUN_CONSOLE", Flag: "run-console", Default: "false",
			Usage: "true: reconciler run also serves the operator console on SBCLAIM_CONSOLE_ADDR",
			Parse: func(v string) error {
				b, err := strconv.ParseBool(v)
				if err != nil {
					return errors.New("want true or false")
				}
				c.RunConsole = b
				return nil
			}},
		{Env: "SBCLAIM_LOG_FORMAT", Flag: "log-format", Default: "json", Usage: "log format: json | text",
			Parse: func(v string) error {
				if v != "json" && v != "text" {
					return errors.New("want json or text")
				}
				c.LogFormat = v
				return nil
			}},
		{Env: "SBCLAIM_LOG_LEVEL", Flag: "log-level", Default: "info", Usage: "log level: debug | info | warn | error",
			Parse: func(v string) error {
				if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
					return errors.New("want debug, info, warn or error")
				}
				return nil
			}},
		settings.Duration("SBCLAIM_SHUTDOWN_TIMEOUT", "shutdown-timeout", "25s",
			"on SIGTERM, wait this long for a running tick (keep it under the platform's grace period)",
			time.Nanosecond, &c.ShutdownTimeout),
	}
}

// configFlags are a Config's settings bound to a FlagSet.
type configFlags struct {
	c *Config
	v *settings.Values
}

// bindConfig binds the settings named in envs (nil binds all), so each
// command's -h lists what it uses; the others keep their built-in
// defaults.
func bindConfig(fs *flag.FlagSet, getenv func(string) string, envs []string) *configFlags {
	c := &Config{}
	return &configFlags{c: c, v: settings.Bind(fs, getenv, configSettings(c), envs...)}
}

// load parses the flags (after fs.Parse) into the Config, reporting every
// bad value as a *ConfigError (joined). Cross-field rules are checked by
// Validate.
func (cf *configFlags) load() (*Config, error) {
	return cf.c, cf.v.Load()
}

// Validate checks the rules between settings that protect correctness. It
// returns every violation as a *ConfigError (joined).
func (c *Config) Validate() error {
	var errs []error
	if window := c.LockDuration * time.Duration(c.MaxDeliveryCount); c.Retention < window {
		errs = append(errs, &ConfigError{Field: "SBCLAIM_RETENTION", Value: c.Retention.String(), Err: fmt.Errorf(
			"must be at least SBCLAIM_LOCK_DURATION × SBCLAIM_MAX_DELIVERY_COUNT = %s × %d = %s: "+
				"until then the broker can still redeliver the original message, and with its claim purged it would run the effect again",
			c.LockDuration, c.MaxDeliveryCount, window)})
	}
	if floor := StaleFactor * c.HeartbeatInterval; c.StaleAfter < floor {
		errs = append(errs, &ConfigError{Field: "SBCLAIM_STALE_AFTER", Value: c.StaleAfter.String(), Err: fmt.Errorf(
			"must be at least %d × SBCLAIM_HEARTBEAT_INTERVAL = %d × %s = %s: "+
				"not comfortably longer than the heartbeat, it would flag claims whose processor is alive and still running the effect",
			StaleFactor, StaleFactor, c.HeartbeatInterval, floor)})
	}
	if c.RecoveryBackoffMax < c.RecoveryBackoff {
		errs = append(errs, &ConfigError{Field: "SBCLAIM_RECOVERY_BACKOFF_MAX", Value: c.RecoveryBackoffMax.String(), Err: fmt.Errorf(
			"must be at least SBCLAIM_RECOVERY_BACKOFF (%s)", c.RecoveryBackoff)})
	}
	if c.PurgeMaxPerTick < c.PurgeBatchSize {
		errs = append(errs, &ConfigError{Field: "SBCLAIM_PURGE_MAX_PER_TICK", Value: strconv.Itoa(c.PurgeMaxPerTick), Err: fmt.Errorf(
			"must be at least SBCLAIM_PURGE_BATCH_SIZE (%d)", c.PurgeBatchSize)})
	}
	return errors.Join(errs...)
}

// ValidateConsole checks the console's identity settings: exactly one way
// to know the operator, and an OIDC issuer with its audience.
func (c *Config) ValidateConsole() error {
	var modes, values []string
	if c.ConsoleOIDCIssuer != "" || c.ConsoleOIDCAudience != "" {
		modes, values = append(modes, "SBCLAIM_CONSOLE_OIDC_ISSUER"), append(values, c.ConsoleOIDCIssuer)
	}
	if c.ConsoleTrustIdentityHeaders {
		modes, values = append(modes, "SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS"), append(values, "true")
	}
	if c.ConsoleLocalOperator != "" {
		modes, values = append(modes, "SBCLAIM_CONSOLE_LOCAL_OPERATOR"), append(values, c.ConsoleLocalOperator)
	}
	switch {
	case len(modes) == 0:
		return &ConfigError{Field: "SBCLAIM_CONSOLE_OIDC_ISSUER", Err: errors.New(
			"the console needs a way to verify who its operators are: set SBCLAIM_CONSOLE_OIDC_ISSUER and SBCLAIM_CONSOLE_OIDC_AUDIENCE " +
				"(the tenant's issuer and the app registration's client id), or SBCLAIM_CONSOLE_LOCAL_OPERATOR for local development")}
	case len(modes) > 1:
		return &ConfigError{Field: modes[1], Value: values[1], Err: fmt.Errorf(
			"the console takes its operators' identity one way only, and %s is set too: unset one", modes[0])}
	case c.ConsoleOIDCIssuer == "" && c.ConsoleOIDCAudience != "":
		return &ConfigError{Field: "SBCLAIM_CONSOLE_OIDC_ISSUER", Err: fmt.Errorf(
			"required with SBCLAIM_CONSOLE_OIDC_AUDIENCE=%q", c.ConsoleOIDCAudience)}
	case c.ConsoleOIDCIssuer == "" && len(c.ConsoleAllowedGroups)+len(c.ConsoleAllowedPrincipals) > 0:
		field, v := "SBCLAIM_CONSOLE_ALLOWED_GROUPS", c.ConsoleAllowedGroups
		if len(v) == 0 {
			field, v = "SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS", c.ConsoleAllowedPrincipals
		}
		return &ConfigError{Field: field, Value: strings.Join(v, ","), Err: errors.New(
			"only with SBCLAIM_CONSOLE_OIDC_ISSUER: the allow-list is checked against verified tokens")}
	case c.ConsoleOIDCIssuer != "" && c.ConsoleOIDCAudience == "":
		return &ConfigError{Field: "SBCLAIM_CONSOLE_OIDC_AUDIENCE", Err: fmt.Errorf(
			"required with SBCLAIM_CONSOLE_OIDC_ISSUER=%q: the app registration's client id, which every token's aud must name", c.ConsoleOIDCIssuer)}
	}
	return nil
}

// objectIDs is a comma-separated list of Entra object ids (GUIDs).
func objectIDs(env, flagName, usage string, dst *[]string) settings.Setting {
	return settings.Setting{Env: env, Flag: flagName, Usage: usage, Parse: func(v string) error {
		*dst = nil
		if v == "" {
			return nil
		}
		for part := range strings.SplitSeq(v, ",") {
			id := strings.TrimSpace(part)
			if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
				return fmt.Errorf("%q is not an object id (a GUID such as 0b5e7a1c-1234-4abc-8def-0123456789ab)", id)
			}
			*dst = append(*dst, id)
		}
		return nil
	}}
}

// validIssuer checks an OIDC issuer: an absolute https URL without query
// or fragment (http only on a loopback host, for tests and local issuers).
func validIssuer(v string) error {
	u, err := url.Parse(v)
	switch {
	case err != nil || u.Host == "" || u.User != nil:
		return errors.New("not an absolute URL (e.g. https://login.microsoftonline.com/<tenant-id>/v2.0)")
	case u.RawQuery != "" || u.Fragment != "":
		return errors.New("an issuer has no query or fragment")
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && (u.Hostname() == "localhost" || net.ParseIP(u.Hostname()).IsLoopback()):
		return nil
	}
	return errors.New("must be https (http only on a loopback host): the keys that prove identities are fetched from it")
}

// reconcilerConfig is the tick's configuration.
func (c *Config) reconcilerConfig(st *sbclaim.Store, routers map[string]*sbclaim.Router) ops.ReconcilerConfig {
	return ops.ReconcilerConfig{
		Store:               st,
		StaleAfter:          c.StaleAfter,
		Retention:           c.Retention,
		FlagBatchSize:       c.FlagBatchSize,
		PurgeBatchSize:      c.PurgeBatchSize,
		MaxPurgePerTick:     c.PurgeMaxPerTick,
		QueryTimeout:        c.QueryTimeout,
		Schedule:            c.Schedule,
		ShutdownTimeout:     c.ShutdownTimeout,
		Routers:             routers,
		RecoveryMaxAttempts: c.RecoveryMaxAttempts,
		RecoveryBackoff:     c.RecoveryBackoff,
		RecoveryBackoffMax:  c.RecoveryBackoffMax,
		RecoveryConcurrency: c.RecoveryConcurrency,
		HeartbeatInterval:   c.HeartbeatInterval,
	}
}

// parseRoutesSpec reads SBCLAIM_ROUTES: "" (none), a path (every
// consumer), or consumer=path pairs separated by commas. It returns the
// paths by consumer ("" for every consumer).
func parseRoutesSpec(v string) (map[string]string, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	if !strings.Contains(v, "=") {
		return map[string]string{"": v}, nil
	}
	out := map[string]string{}
	for part := range strings.SplitSeq(v, ",") {
		consumer, path, ok := strings.Cut(strings.TrimSpace(part), "=")
		consumer, path = strings.TrimSpace(consumer), strings.TrimSpace(path)
		switch {
		case !ok || consumer == "" || path == "":
			return nil, fmt.Errorf("%q is not consumer=path (write one path for every consumer, or billing=/etc/sbclaim/billing.yaml,notifications=/etc/sbclaim/notify.yaml)", part)
		case out[consumer] != "":
			return nil, fmt.Errorf("consumer %q is given twice", consumer)
		}
		out[consumer] = path
	}
	return out, nil
}
