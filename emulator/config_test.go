package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.yaml.in/yaml/v3"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
)

// Limits of the Service Bus emulator, from its documentation and its
// Config.json schema (Azure/azure-service-bus-emulator-installer).
const (
	emulatorNamespace   = "sbemulatorns"
	maxEntities         = 50 // queues + topics + subscriptions
	maxConnections      = 10 // concurrent AMQP connections
	minLock             = 5 * time.Second
	minSubscriptionLock = time.Minute // the schema's minimum for subscriptions
	maxLock             = 5 * time.Minute
	minTTL              = 5 * time.Minute
	maxTTL              = time.Hour
	minDupWindow        = 5 * time.Second
	maxDupWindow        = 5 * time.Minute
	minDeliveryCount    = 1
	maxDeliveryCount    = 10
)

// Subjects demosender sends (cmd/demosender/plan.go).
const (
	paymentSubject = "payment"
	orderSubject   = "order"
	poisonSubject  = "refund"
)

// The Config.json shape. Unknown fields are rejected, so a misspelt
// property (silently ignored by the emulator) fails the test.
type config struct {
	UserConfig struct {
		Namespaces []namespace `json:"Namespaces"`
		Logging    struct {
			Type string `json:"Type"`
		} `json:"Logging"`
	} `json:"UserConfig"`
}

type namespace struct {
	Name   string  `json:"Name"`
	Queues []queue `json:"Queues"`
	Topics []topic `json:"Topics"`
}

type queue struct {
	Name       string          `json:"Name"`
	Properties queueProperties `json:"Properties"`
}

type queueProperties struct {
	DeadLetteringOnMessageExpiration    bool   `json:"DeadLetteringOnMessageExpiration"`
	DefaultMessageTimeToLive            string `json:"DefaultMessageTimeToLive"`
	DuplicateDetectionHistoryTimeWindow string `json:"DuplicateDetectionHistoryTimeWindow"`
	ForwardDeadLetteredMessagesTo       string `json:"ForwardDeadLetteredMessagesTo"`
	ForwardTo                           string `json:"ForwardTo"`
	LockDuration                        string `json:"LockDuration"`
	MaxDeliveryCount                    int    `json:"MaxDeliveryCount"`
	RequiresDuplicateDetection          bool   `json:"RequiresDuplicateDetection"`
	RequiresSession                     bool   `json:"RequiresSession"`
}

type topic struct {
	Name       string `json:"Name"`
	Properties struct {
		DefaultMessageTimeToLive            string `json:"DefaultMessageTimeToLive"`
		DuplicateDetectionHistoryTimeWindow string `json:"DuplicateDetectionHistoryTimeWindow"`
		RequiresDuplicateDetection          bool   `json:"RequiresDuplicateDetection"`
	} `json:"Properties"`
	Subscriptions []subscription `json:"Subscriptions"`
}

type subscription struct {
	Name       string `json:"Name"`
	Properties struct {
		DeadLetteringOnMessageExpiration bool   `json:"DeadLetteringOnMessageExpiration"`
		DefaultMessageTimeToLive         string `json:"DefaultMessageTimeToLive"`
		ForwardDeadLetteredMessagesTo    string `json:"ForwardDeadLetteredMessagesTo"`
		ForwardTo                        string `json:"ForwardTo"`
		LockDuration                     string `json:"LockDuration"`
		MaxDeliveryCount                 int    `json:"MaxDeliveryCount"`
		RequiresSession                  bool   `json:"RequiresSession"`
	} `json:"Properties"`
	Rules []json.RawMessage `json:"Rules"`
}

func loadConfig(t *testing.T) *config {
	t.Helper()
	data, err := os.ReadFile("Config.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c config
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("Config.json: %v", err)
	}
	if len(c.UserConfig.Namespaces) != 1 {
		t.Fatalf("Config.json: the emulator takes exactly one namespace, got %d", len(c.UserConfig.Namespaces))
	}
	return &c
}

// isoDuration matches the ISO-8601 durations the emulator accepts, limited
// to days and time parts (years and months have no fixed length).
var isoDuration = regexp.MustCompile(`^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$`)

// parseISODuration parses an ISO-8601 duration such as PT30S, PT1M,
// PT1H30M or P1DT2H.
func parseISODuration(s string) (time.Duration, error) {
	m := isoDuration.FindStringSubmatch(s)
	if m == nil || s == "P" || strings.HasSuffix(s, "T") {
		return 0, fmt.Errorf("%q is not an ISO-8601 duration (PnDTnHnMnS)", s)
	}
	var d time.Duration
	for i, unit := range []time.Duration{24 * time.Hour, time.Hour, time.Minute} {
		if m[i+1] == "" {
			continue
		}
		n, err := strconv.ParseInt(m[i+1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", s, err)
		}
		d += time.Duration(n) * unit
	}
	if m[4] != "" {
		f, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", s, err)
		}
		d += time.Duration(f * float64(time.Second))
	}
	return d, nil
}

func TestParseISODuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"PT5S":     5 * time.Second,
		"PT30S":    30 * time.Second,
		"PT1M":     time.Minute,
		"PT5M":     5 * time.Minute,
		"PT1H":     time.Hour,
		"PT1H30M":  90 * time.Minute,
		"P1D":      24 * time.Hour,
		"P1DT2H":   26 * time.Hour,
		"PT0.5S":   500 * time.Millisecond,
		"PT1M30S":  90 * time.Second,
		"P0DT0H5M": 5 * time.Minute,
	} {
		got, err := parseISODuration(in)
		if err != nil || got != want {
			t.Errorf("parseISODuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "P", "PT", "30s", "PT5", "P1Y", "P1M", "PT-5S", "pt5s", "P1DT"} {
		if d, err := parseISODuration(bad); err == nil {
			t.Errorf("parseISODuration(%q) = %v, want an error", bad, d)
		}
	}
}

// entityName is the emulator schema's pattern for entity names.
var entityName = regexp.MustCompile(`^[A-Za-z0-9]$|^[A-Za-z0-9][\w.\-/]*[A-Za-z0-9]$`)

// checkRange parses an ISO-8601 value and checks it lies within [lo, hi].
func checkRange(field, value string, lo, hi time.Duration) (time.Duration, error) {
	d, err := parseISODuration(value)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	if d < lo || d > hi {
		return d, fmt.Errorf("%s = %s (%v) is outside the emulator's range %v..%v", field, value, d, lo, hi)
	}
	return d, nil
}

// entityLimits summarises Config.json for the compose checks.
type entityLimits struct {
	queues        map[string]bool
	queueLocks    map[string]time.Duration
	subscriptions map[string]map[string]bool // topic -> subscription
	maxLock       time.Duration
	maxDeliveries int
	// deliveries is each entity's MaxDeliveryCount, by the name a
	// processor's claims record: the queue, or topic/subscription.
	deliveries map[string]int
	// sessions are the session-enabled queues (RequiresSession).
	sessions map[string]bool
}

// checkConfig applies the emulator's limits and returns what it declares.
func checkConfig(c *config) (entityLimits, []error) {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	lim := entityLimits{queues: map[string]bool{}, queueLocks: map[string]time.Duration{}, subscriptions: map[string]map[string]bool{}, deliveries: map[string]int{},
		sessions: map[string]bool{}}

	switch c.UserConfig.Logging.Type {
	case "Console", "File,Console", "Console,File":
	case "File":
		fail("Logging.Type = File: the emulator's logs would only be in a file inside the container, not in `docker compose logs servicebus`; use Console")
	default:
		fail("Logging.Type = %q, want Console (or File,Console)", c.UserConfig.Logging.Type)
	}
	ns := c.UserConfig.Namespaces[0]
	if ns.Name != emulatorNamespace {
		fail("namespace %q: the emulator only accepts %q", ns.Name, emulatorNamespace)
	}

	entities := 0
	names := map[string]bool{}
	name := func(kind, n string) {
		entities++
		if !entityName.MatchString(n) {
			fail("%s name %q does not match %s", kind, n, entityName)
		}
	}
	deliveries := func(field string, n int) {
		if n < minDeliveryCount || n > maxDeliveryCount {
			fail("%s = %d is outside the emulator's range %d..%d", field, n, minDeliveryCount, maxDeliveryCount)
		}
		lim.maxDeliveries = max(lim.maxDeliveries, n)
	}
	lock := func(field, v string, lo time.Duration) time.Duration {
		d, err := checkRange(field, v, lo, maxLock)
		if err != nil {
			errs = append(errs, err)
		}
		lim.maxLock = max(lim.maxLock, d)
		return d
	}
	ttl := func(field, v string) {
		if _, err := checkRange(field, v, minTTL, maxTTL); err != nil {
			errs = append(errs, err)
		}
	}
	dupWindow := func(field, v string) {
		if _, err := checkRange(field, v, minDupWindow, maxDupWindow); err != nil {
			errs = append(errs, err)
		}
	}

	for _, q := range ns.Queues {
		name("queue", q.Name)
		if names[q.Name] {
			fail("entity name %q is used twice", q.Name)
		}
		names[q.Name] = true
		lim.queues[q.Name] = true
		p := q.Properties
		lim.queueLocks[q.Name] = lock("queue "+q.Name+" LockDuration", p.LockDuration, minLock)
		deliveries("queue "+q.Name+" MaxDeliveryCount", p.MaxDeliveryCount)
		lim.deliveries[q.Name] = p.MaxDeliveryCount
		ttl("queue "+q.Name+" DefaultMessageTimeToLive", p.DefaultMessageTimeToLive)
		dupWindow("queue "+q.Name+" DuplicateDetectionHistoryTimeWindow", p.DuplicateDetectionHistoryTimeWindow)
		if p.RequiresSession && !sessionQueues[q.Name] {
			fail("queue %s requires sessions: only the session entities (%v) may; the others are received without sessions", q.Name, slices.Sorted(maps.Keys(sessionQueues)))
		}
		lim.sessions[q.Name] = p.RequiresSession
	}
	for _, tp := range ns.Topics {
		name("topic", tp.Name)
		if names[tp.Name] {
			fail("entity name %q is used twice", tp.Name)
		}
		names[tp.Name] = true
		ttl("topic "+tp.Name+" DefaultMessageTimeToLive", tp.Properties.DefaultMessageTimeToLive)
		dupWindow("topic "+tp.Name+" DuplicateDetectionHistoryTimeWindow", tp.Properties.DuplicateDetectionHistoryTimeWindow)
		if len(tp.Subscriptions) == 0 {
			fail("topic %s has no subscription (the emulator requires at least one)", tp.Name)
		}
		subs := map[string]bool{}
		for _, s := range tp.Subscriptions {
			field := "subscription " + tp.Name + "/" + s.Name
			name("subscription", s.Name)
			if subs[s.Name] {
				fail("%s is declared twice", field)
			}
			subs[s.Name] = true
			lock(field+" LockDuration", s.Properties.LockDuration, minSubscriptionLock)
			deliveries(field+" MaxDeliveryCount", s.Properties.MaxDeliveryCount)
			lim.deliveries[tp.Name+"/"+s.Name] = s.Properties.MaxDeliveryCount
			ttl(field+" DefaultMessageTimeToLive", s.Properties.DefaultMessageTimeToLive)
			if s.Properties.RequiresSession {
				fail("%s requires sessions: the processor receives without sessions", field)
			}
		}
		lim.subscriptions[tp.Name] = subs
	}
	if entities > maxEntities {
		fail("%d entities (queues + topics + subscriptions); the emulator allows %d", entities, maxEntities)
	}
	return lim, errs
}

// sessionQueues are the session-enabled queues: processor-ledger consumes
// ledger in session mode (SBCLAIM_SESSIONS); the broker contract suite's
// session cases use brokertest-sessions.
var sessionQueues = map[string]bool{"ledger": true, "brokertest-sessions": true}

// TestComposeSessionEntitiesRunInSessionMode: a processor on a
// session-enabled queue sets SBCLAIM_SESSIONS (without it the processor
// could not receive at all), and one on any other entity does not (session
// receivers cannot receive from it).
func TestComposeSessionEntitiesRunInSessionMode(t *testing.T) {
	t.Parallel()
	lim, _ := checkConfig(loadConfig(t))
	compose := loadCompose(t)
	seen := false
	for _, name := range slices.Sorted(maps.Keys(compose.Services)) {
		env := compose.Services[name].Environment
		entity := processorEntity(env)
		if entity == "" {
			continue
		}
		n, _ := strconv.Atoi(env["SBCLAIM_SESSIONS"])
		switch {
		case lim.sessions[entity] && n < 1:
			t.Errorf("service %s: queue %s requires sessions, SBCLAIM_SESSIONS=%q (want at least 1)", name, entity, env["SBCLAIM_SESSIONS"])
		case !lim.sessions[entity] && n > 0:
			t.Errorf("service %s: SBCLAIM_SESSIONS=%d, but %s is not session-enabled", name, n, entity)
		}
		seen = seen || lim.sessions[entity]
	}
	if !seen {
		t.Error("no compose processor consumes a session-enabled queue (processor-ledger on ledger)")
	}
}

func TestConfigWithinEmulatorLimits(t *testing.T) {
	t.Parallel()
	lim, errs := checkConfig(loadConfig(t))
	for _, err := range errs {
		t.Error(err)
	}
	// What docker-compose.yml and the README rely on.
	if !lim.queues["payments"] {
		t.Error(`queue "payments" is missing`)
	}
	if subs := lim.subscriptions["orders"]; !subs["billing"] || !subs["notifications"] {
		t.Errorf(`topic "orders" needs subscriptions billing and notifications, has %v`, subs)
	}
	// The gated Service Bus test of internal/processor (TestServiceBus)
	// uses this queue by default; it must exist and no compose service may
	// consume it (TestComposeEntitiesExist checks the second part).
	if !lim.queues[integrationQueue] {
		t.Errorf("queue %q (internal/processor's TestServiceBus) is missing", integrationQueue)
	}
	// The broker contract suite (internal/testkit/membus/brokertest, gated
	// TestServiceBusContract) has its own entities, so that it can run at
	// the same time as TestServiceBus: a queue whose locks run out quickly
	// (its lock-expiry cases wait for the real lock) and a topic with two
	// subscriptions.
	if !lim.queues[contractQueue] {
		t.Errorf("queue %q (the broker contract suite) is missing", contractQueue)
	} else if l := lim.queueLocks[contractQueue]; l > 30*time.Second {
		t.Errorf("queue %q has LockDuration %v; the contract suite waits for locks to run out, keep it at most 30s", contractQueue, l)
	}
	if subs := lim.subscriptions[contractTopic]; len(subs) < 2 {
		t.Errorf("topic %q (the broker contract suite) needs two subscriptions, has %v", contractTopic, subs)
	}
}

// integrationQueue is the default queue of internal/processor's gated
// TestServiceBus (SBCLAIM_TEST_SERVICEBUS_QUEUE).
const integrationQueue = "integration"

// Entities of the gated broker contract run
// (internal/testkit/membus/brokertest/servicebus_test.go).
const (
	contractQueue = "brokertest"
	contractTopic = "brokertest-topic"
)

// The limit checks must be able to fail: break a copy of the config in each
// way the emulator would reject and expect an error naming it.
func TestCheckConfigRejects(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*config)
		want   string
	}{
		"namespace":      {func(c *config) { c.UserConfig.Namespaces[0].Name = "prod" }, "sbemulatorns"},
		"logging":        {func(c *config) { c.UserConfig.Logging.Type = "" }, "Logging.Type"},
		"file logging":   {func(c *config) { c.UserConfig.Logging.Type = "File" }, "Console"},
		"lock too short": {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.LockDuration = "PT4S" }, "LockDuration"},
		"lock too long":  {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.LockDuration = "PT6M" }, "LockDuration"},
		"lock not iso":   {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.LockDuration = "30s" }, "ISO-8601"},
		"subscription lock": {func(c *config) {
			c.UserConfig.Namespaces[0].Topics[0].Subscriptions[0].Properties.LockDuration = "PT30S"
		}, "LockDuration"},
		"deliveries 0":  {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.MaxDeliveryCount = 0 }, "MaxDeliveryCount"},
		"deliveries 11": {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.MaxDeliveryCount = 11 }, "MaxDeliveryCount"},
		"ttl":           {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.DefaultMessageTimeToLive = "PT2H" }, "DefaultMessageTimeToLive"},
		"topic ttl":     {func(c *config) { c.UserConfig.Namespaces[0].Topics[0].Properties.DefaultMessageTimeToLive = "P1D" }, "DefaultMessageTimeToLive"},
		"sessions":      {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Properties.RequiresSession = true }, "sessions"},
		"bad name":      {func(c *config) { c.UserConfig.Namespaces[0].Queues[0].Name = "-payments" }, "does not match"},
		"too many entities": {func(c *config) {
			ns := &c.UserConfig.Namespaces[0]
			for i := range maxEntities {
				q := ns.Queues[0]
				q.Name = fmt.Sprintf("extra%d", i)
				ns.Queues = append(ns.Queues, q)
			}
		}, "entities"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := loadConfig(t)
			tc.mutate(c)
			_, errs := checkConfig(c)
			err := errors.Join(errs...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// The docker-compose.yml shape, as far as these checks need it.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image           string            `yaml:"image"`
	Platform        string            `yaml:"platform"`
	Ports           []string          `yaml:"ports"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	DependsOn       map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return &c
}

// hostFile maps a container path to the repository file mounted there.
func (s composeService) hostFile(containerPath string) (string, bool) {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == containerPath && strings.HasPrefix(parts[0], "./") {
			return filepath.Join("..", filepath.FromSlash(parts[0])), true
		}
	}
	return "", false
}

func TestComposeEntitiesExist(t *testing.T) {
	t.Parallel()
	lim, _ := checkConfig(loadConfig(t))
	compose := loadCompose(t)

	consumers := map[string]map[string][]string{} // entity -> consumer -> services
	connections := 0
	for name, svc := range compose.Services {
		env := svc.Environment
		if env["SBCLAIM_SERVICEBUS_CONNECTION_STRING"] != "" {
			connections++
		}
		q, tp, sub := env["SBCLAIM_QUEUE"], env["SBCLAIM_TOPIC"], env["SBCLAIM_SUBSCRIPTION"]
		if q != "" && !lim.queues[q] {
			t.Errorf("service %s: SBCLAIM_QUEUE=%q is not a queue in Config.json", name, q)
		}
		if q == integrationQueue || q == contractQueue {
			t.Errorf("service %s uses queue %q, which a gated Service Bus test drains and owns", name, q)
		}
		if tp == contractTopic {
			t.Errorf("service %s uses topic %q, which the gated broker contract test drains and owns", name, tp)
		}
		if tp != "" {
			if _, ok := lim.subscriptions[tp]; !ok {
				t.Errorf("service %s: SBCLAIM_TOPIC=%q is not a topic in Config.json", name, tp)
			}
		}
		if sub != "" && !lim.subscriptions[tp][sub] {
			t.Errorf("service %s: subscription %q of topic %q is not in Config.json", name, sub, tp)
		}
		// Receivers name one entity and a consumer; only the sender may
		// name a queue and a topic, or a topic without a subscription.
		if c := env["SBCLAIM_CONSUMER"]; c != "" {
			entity := q
			if q == "" {
				entity = tp + "/" + sub
			}
			if (q == "") == (tp == "") || (tp != "" && sub == "") {
				t.Errorf("service %s: a processor needs SBCLAIM_QUEUE or SBCLAIM_TOPIC+SBCLAIM_SUBSCRIPTION, has %q %q %q", name, q, tp, sub)
			}
			if consumers[entity] == nil {
				consumers[entity] = map[string][]string{}
			}
			consumers[entity][c] = append(consumers[entity][c], name)
		}
	}

	// Two replicas of one consumer on the queue, so duplicates race.
	if reps := consumers["payments"]["payments"]; len(reps) < 2 {
		t.Errorf("want at least two processor replicas of consumer payments on queue payments, got %v", reps)
	}
	// Every subscription of orders is consumed, each by its own consumer.
	seen := map[string]bool{}
	for sub := range lim.subscriptions["orders"] {
		cs := consumers["orders/"+sub]
		if len(cs) == 0 {
			t.Errorf("subscription orders/%s has no processor", sub)
		}
		for c := range cs {
			if seen[c] {
				t.Errorf("consumer %q is used on two subscriptions: their claims would collide", c)
			}
			seen[c] = true
		}
	}

	sender, ok := compose.Services["demosender"]
	if !ok {
		t.Fatal("no demosender service")
	}
	if q := sender.Environment["SBCLAIM_QUEUE"]; !lim.queues[q] {
		t.Errorf("demosender sends to queue %q, not in Config.json", q)
	}
	if tp := sender.Environment["SBCLAIM_TOPIC"]; lim.subscriptions[tp] == nil {
		t.Errorf("demosender sends to topic %q, not in Config.json", tp)
	}
	if connections > maxConnections {
		t.Errorf("%d services connect to the emulator; it allows %d connections", connections, maxConnections)
	}

	sb := compose.Services["servicebus"]
	if f, ok := sb.hostFile("/ServiceBus_Emulator/ConfigFiles/Config.json"); !ok || filepath.Base(f) != "Config.json" {
		t.Errorf("servicebus does not mount emulator/Config.json at /ServiceBus_Emulator/ConfigFiles/Config.json: %v", sb.Volumes)
	}
}

// routeURLs returns every url in a routes file (top level and steps).
func routeURLs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Routes []struct {
			URL   string `yaml:"url"`
			Steps []struct {
				URL string `yaml:"url"`
			} `yaml:"steps"`
		} `yaml:"routes"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var urls []string
	for _, r := range doc.Routes {
		if r.URL != "" {
			urls = append(urls, r.URL)
		}
		for _, s := range r.Steps {
			urls = append(urls, s.URL)
		}
	}
	return urls
}

func message(subject, body string) *azservicebus.ReceivedMessage {
	return &azservicebus.ReceivedMessage{MessageID: "m1", Subject: &subject, Body: []byte(body)}
}

func TestComposeRoutes(t *testing.T) {
	t.Parallel()
	compose := loadCompose(t)
	logger := slog.New(slog.DiscardHandler)

	mounted := map[string]bool{}
	consumerFile := map[string]string{} // consumer → the routes file its processors mount
	var reconcilerRoutes map[string]string
	for name, svc := range compose.Services {
		spec := svc.Environment["SBCLAIM_ROUTES"]
		if spec == "" {
			continue
		}
		if strings.Contains(spec, "=") && name != "reconciler" {
			continue // the operator console's pairs: TestComposeConsole
		}
		if strings.Contains(spec, "=") {
			// The reconciler: consumer=path pairs, one routes file per
			// consumer (checked against the processors' below).
			reconcilerRoutes = map[string]string{}
			for _, pair := range strings.Split(spec, ",") {
				consumer, path, _ := strings.Cut(pair, "=")
				file, ok := svc.hostFile(path)
				if !ok {
					t.Errorf("service %s: SBCLAIM_ROUTES entry %s=%s is not a file mounted from the repository", name, consumer, path)
					continue
				}
				reconcilerRoutes[consumer] = file
			}
			continue
		}
		routesPath := spec
		file, ok := svc.hostFile(routesPath)
		if !ok {
			t.Errorf("service %s: SBCLAIM_ROUTES=%s is not a file mounted from the repository", name, routesPath)
			continue
		}
		mounted[filepath.Base(file)] = true
		if c := svc.Environment["SBCLAIM_CONSUMER"]; c != "" {
			consumerFile[c] = file
		}

		// The processor's own loader: schema, URLs, headers.
		router, err := routesfile.Load(file, os.Getenv, logger)
		if err != nil {
			t.Errorf("service %s: %v", name, err)
			continue
		}
		for _, raw := range routeURLs(t, file) {
			u, err := url.Parse(raw)
			if err != nil {
				t.Errorf("%s: %v", file, err)
				continue
			}
			host := u.Hostname()
			target, ok := compose.Services[host]
			if !ok {
				t.Errorf("%s: route URL %s: host %q is not a compose service", file, raw, host)
				continue
			}
			if host == "demoapi" {
				_, port, _ := net.SplitHostPort(target.Environment["SBCLAIM_DEMOAPI_ADDR"])
				if u.Port() != port {
					t.Errorf("%s: route URL %s: demoapi listens on port %q", file, raw, port)
				}
			}
		}

		// What demosender sends must be routed, except the poison message.
		env := svc.Environment
		if _, err := router.Route(message(poisonSubject, `{"x":1}`)); !isNoRoute(err) {
			t.Errorf("service %s: subject %q must have no route (demosender's poison message), got %v", name, poisonSubject, err)
		}
		var want string
		switch {
		case env["SBCLAIM_QUEUE"] == "payments":
			want = paymentSubject
		case env["SBCLAIM_TOPIC"] == "orders":
			want = orderSubject
		default:
			continue // the reconciler: checked through the processors' files
		}
		if _, err := router.Route(message(want, `{"id":"x"}`)); err != nil {
			t.Errorf("service %s: subject %q has no route: %v", name, want, err)
		}
	}

	// The reconciler recovers each consumer's claims through that
	// consumer's own routes file, and knows every consumer.
	if reconcilerRoutes == nil {
		t.Error("no service (the reconciler) sets SBCLAIM_ROUTES as consumer=path pairs")
	}
	for consumer, file := range consumerFile {
		if got := reconcilerRoutes[consumer]; got != file {
			t.Errorf("reconciler SBCLAIM_ROUTES: consumer %s uses %q, its processors mount %q", consumer, got, file)
		}
	}
	for consumer := range reconcilerRoutes {
		if consumerFile[consumer] == "" {
			t.Errorf("reconciler SBCLAIM_ROUTES names consumer %s, which no processor has", consumer)
		}
	}

	// Every compose routes file is used, and routes.compose.yaml (the one the
	// README names) is among them.
	files, err := filepath.Glob("routes*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !mounted[f] {
			t.Errorf("emulator/%s is not mounted as SBCLAIM_ROUTES by any service", f)
		}
	}
	if !mounted["routes.compose.yaml"] {
		t.Error("emulator/routes.compose.yaml is not used by any service")
	}

	// The reconciler can redrive claims of every consumer: each processor's
	// routes file is mounted in it too.
	rec := compose.Services["reconciler"]
	for f := range mounted {
		found := false
		for _, v := range rec.Volumes {
			if strings.HasPrefix(v, "./emulator/"+f+":") {
				found = true
			}
		}
		if !found {
			t.Errorf("reconciler does not mount emulator/%s (needed to redrive that consumer's claims)", f)
		}
	}
}

func isNoRoute(err error) bool {
	var ie *sideeffects.InputError
	return errors.As(err, &ie) && ie.Reason == sideeffects.ReasonNoRoute
}

func composeDuration(t *testing.T, service, field, v string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("service %s: %s=%q: %v", service, field, v, err)
	}
	return d
}

// The reconciler refuses windows that are too short; check the compose
// values against the same rules and against Config.json, so that
// `docker compose up` does not stop on a configuration error.
func TestComposeReconcilerWindows(t *testing.T) {
	t.Parallel()
	lim, _ := checkConfig(loadConfig(t))
	compose := loadCompose(t)
	rec, ok := compose.Services["reconciler"]
	if !ok {
		t.Fatal("no reconciler service")
	}
	env := rec.Environment
	if !slices.Equal(rec.Command, []string{"run"}) {
		t.Errorf("reconciler command = %v, want [run]", rec.Command)
	}
	heartbeat := composeDuration(t, "reconciler", "SBCLAIM_HEARTBEAT_INTERVAL", env["SBCLAIM_HEARTBEAT_INTERVAL"])
	stale := composeDuration(t, "reconciler", "SBCLAIM_STALE_AFTER", env["SBCLAIM_STALE_AFTER"])
	retention := composeDuration(t, "reconciler", "SBCLAIM_RETENTION", env["SBCLAIM_RETENTION"])
	lock := composeDuration(t, "reconciler", "SBCLAIM_LOCK_DURATION", env["SBCLAIM_LOCK_DURATION"])
	deliveries, err := strconv.Atoi(env["SBCLAIM_MAX_DELIVERY_COUNT"])
	if err != nil {
		t.Fatalf("SBCLAIM_MAX_DELIVERY_COUNT: %v", err)
	}

	if stale < 3*heartbeat {
		t.Errorf("SBCLAIM_STALE_AFTER %v < 3 × heartbeat %v", stale, heartbeat)
	}
	if lock < lim.maxLock || deliveries < lim.maxDeliveries {
		t.Errorf("reconciler assumes lock %v × %d deliveries; Config.json has up to %v × %d", lock, deliveries, lim.maxLock, lim.maxDeliveries)
	}
	if retention < lock*time.Duration(deliveries) {
		t.Errorf("SBCLAIM_RETENTION %v < lock %v × %d deliveries", retention, lock, deliveries)
	}
	if retention < maxTTL {
		t.Errorf("SBCLAIM_RETENTION %v is shorter than the entities' message TTL %v: a message could be redelivered after its claim is purged", retention, maxTTL)
	}

	for name, svc := range compose.Services {
		penv := svc.Environment
		if penv["SBCLAIM_CONSUMER"] == "" {
			continue
		}
		if hb := penv["SBCLAIM_HEARTBEAT_INTERVAL"]; composeDuration(t, name, "SBCLAIM_HEARTBEAT_INTERVAL", hb) != heartbeat {
			t.Errorf("service %s: heartbeat %s differs from the reconciler's %v", name, hb, heartbeat)
		}
		shutdown := composeDuration(t, name, "SBCLAIM_SHUTDOWN_TIMEOUT", penv["SBCLAIM_SHUTDOWN_TIMEOUT"])
		grace := composeDuration(t, name, "stop_grace_period", svc.StopGracePeriod)
		if shutdown >= grace {
			t.Errorf("service %s: SBCLAIM_SHUTDOWN_TIMEOUT %v must be below stop_grace_period %v", name, shutdown, grace)
		}
		// The processor checks its shutdown budget against the grace
		// period it is told; it must be the one Docker gives.
		if g := composeDuration(t, name, "SBCLAIM_TERMINATION_GRACE_PERIOD", penv["SBCLAIM_TERMINATION_GRACE_PERIOD"]); g != grace {
			t.Errorf("service %s: SBCLAIM_TERMINATION_GRACE_PERIOD %v differs from stop_grace_period %v", name, g, grace)
		}
		if s := composeDuration(t, name, "SBCLAIM_STALE_AFTER", penv["SBCLAIM_STALE_AFTER"]); s != stale {
			t.Errorf("service %s: SBCLAIM_STALE_AFTER %v differs from the reconciler's %v", name, s, stale)
		}
		if to := composeDuration(t, name, "SBCLAIM_TAKEOVER_AFTER", penv["SBCLAIM_TAKEOVER_AFTER"]); to < 3*heartbeat || to > stale {
			t.Errorf("service %s: SBCLAIM_TAKEOVER_AFTER %v should lie between 3 × heartbeat (%v) and the stale window %v", name, to, 3*heartbeat, stale)
		}
		if svc.DependsOn["migrate"].Condition != "service_completed_successfully" {
			t.Errorf("service %s must wait for migrate to complete", name)
		}
	}
}

// pinnedTag is a release version such as 1.1.2: not latest, not a
// floating major tag.
var pinnedTag = regexp.MustCompile(`:[0-9]+\.[0-9]+\.[0-9]+$`)

// The laptop stack must not expose the SA login or the emulator to the
// network, must start the same emulator every time, and must run on Apple
// Silicon.
func TestComposeLaptopSafety(t *testing.T) {
	t.Parallel()
	compose := loadCompose(t)
	for name, svc := range compose.Services {
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q on every interface; publish on 127.0.0.1 only (\"127.0.0.1:%s\")", name, p, p)
			}
		}
		// mssql/server has no arm64 image: without the platform, an Apple
		// Silicon Mac pulls nothing runnable.
		if strings.HasPrefix(svc.Image, "mcr.microsoft.com/mssql/server:") && svc.Platform != "linux/amd64" {
			t.Errorf("service %s runs %s without platform: linux/amd64", name, svc.Image)
		}
	}
	sb, ok := compose.Services["servicebus"]
	if !ok {
		t.Fatal("no servicebus service")
	}
	if !strings.HasPrefix(sb.Image, "mcr.microsoft.com/azure-messaging/servicebus-emulator:") || !pinnedTag.MatchString(sb.Image) {
		t.Errorf("servicebus image %q: pin the emulator to a release (servicebus-emulator:X.Y.Z), not latest", sb.Image)
	}
	if v := sb.Environment["SQL_WAIT_INTERVAL"]; v == "" {
		t.Error("servicebus: SQL_WAIT_INTERVAL is not set; the emulator then waits 15 s for a SQL Server that depends_on already found healthy")
	} else if n, err := strconv.Atoi(v); err != nil || n < 0 {
		t.Errorf("servicebus: SQL_WAIT_INTERVAL=%q is not a number of seconds", v)
	}
	if sb.DependsOn["sqlserver"].Condition != "service_healthy" {
		t.Error("servicebus must wait for sqlserver to be healthy (SQL_WAIT_INTERVAL is short because of it)")
	}
}

// processorEntity is the entity a compose processor receives from, named
// as Config.json's limits name it ("" for a service that is not one).
func processorEntity(env map[string]string) string {
	switch {
	case env["SBCLAIM_CONSUMER"] == "":
		return ""
	case env["SBCLAIM_QUEUE"] != "":
		return env["SBCLAIM_QUEUE"]
	default:
		return env["SBCLAIM_TOPIC"] + "/" + env["SBCLAIM_SUBSCRIPTION"]
	}
}

// checkDeliveryBudgets compares each processor's SBCLAIM_MAX_DELIVERY_COUNT
// with its entity's MaxDeliveryCount. The processor hands a claim to the
// reconciler from the second-to-last delivery on, counting deliveries by
// this setting: set higher than the entity's, an outage dead-letters
// messages the processor thought had deliveries left; set lower, it gives
// up on deferral early. Unset is an error too: the processor would assume
// 10, and it cannot read the emulator's value to correct itself.
func checkDeliveryBudgets(compose *composeFile, lim entityLimits) []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(compose.Services)) {
		env := compose.Services[name].Environment
		entity := processorEntity(env)
		if entity == "" {
			continue
		}
		want, ok := lim.deliveries[entity]
		if !ok {
			continue // TestComposeEntitiesExist reports the unknown entity
		}
		v, set := env["SBCLAIM_MAX_DELIVERY_COUNT"]
		if !set {
			errs = append(errs, fmt.Errorf("service %s: SBCLAIM_MAX_DELIVERY_COUNT is not set; its entity %s has MaxDeliveryCount %d in Config.json (the processor would assume 10)", name, entity, want))
			continue
		}
		got, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("service %s: SBCLAIM_MAX_DELIVERY_COUNT=%q is not a number", name, v))
			continue
		}
		if got != want {
			errs = append(errs, fmt.Errorf("service %s: SBCLAIM_MAX_DELIVERY_COUNT=%d, but its entity %s has MaxDeliveryCount %d in Config.json", name, got, entity, want))
		}
	}
	return errs
}

func TestComposeDeliveryBudgetMatchesEntity(t *testing.T) {
	t.Parallel()
	lim, _ := checkConfig(loadConfig(t))
	compose := loadCompose(t)
	processors := 0
	for _, svc := range compose.Services {
		if processorEntity(svc.Environment) != "" {
			processors++
		}
	}
	if processors == 0 {
		t.Fatal("docker-compose.yml: no processor service (SBCLAIM_CONSUMER)")
	}
	for _, err := range checkDeliveryBudgets(compose, lim) {
		t.Error(err)
	}
}

// The check must be able to fail: a processor left at the default, one
// set to another number, and an entity changed in Config.json alone.
func TestCheckDeliveryBudgetsRejects(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*composeFile, *config)
		want   string
	}{
		"unset": {func(c *composeFile, _ *config) {
			delete(c.Services["processor-billing"].Environment, "SBCLAIM_MAX_DELIVERY_COUNT")
		}, "service processor-billing: SBCLAIM_MAX_DELIVERY_COUNT is not set; its entity orders/billing has MaxDeliveryCount"},
		"default": {func(c *composeFile, _ *config) {
			c.Services["processor-1"].Environment["SBCLAIM_MAX_DELIVERY_COUNT"] = "10"
		}, "service processor-1: SBCLAIM_MAX_DELIVERY_COUNT=10, but its entity payments has MaxDeliveryCount"},
		"not a number": {func(c *composeFile, _ *config) {
			c.Services["processor-2"].Environment["SBCLAIM_MAX_DELIVERY_COUNT"] = "five"
		}, `service processor-2: SBCLAIM_MAX_DELIVERY_COUNT="five"`},
		"entity changed": {func(_ *composeFile, cfg *config) {
			for i, tp := range cfg.UserConfig.Namespaces[0].Topics {
				for j, s := range tp.Subscriptions {
					if tp.Name == "orders" && s.Name == "notifications" {
						cfg.UserConfig.Namespaces[0].Topics[i].Subscriptions[j].Properties.MaxDeliveryCount = 3
					}
				}
			}
		}, "service processor-notifications: SBCLAIM_MAX_DELIVERY_COUNT=5, but its entity orders/notifications has MaxDeliveryCount 3"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			compose, cfg := loadCompose(t), loadConfig(t)
			if errs := checkDeliveryBudgets(compose, mustLimits(t, cfg)); len(errs) != 0 {
				t.Fatalf("the files as they are: %v", errors.Join(errs...))
			}
			tc.mutate(compose, cfg)
			err := errors.Join(checkDeliveryBudgets(compose, mustLimits(t, cfg))...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func mustLimits(t *testing.T, c *config) entityLimits {
	t.Helper()
	lim, errs := checkConfig(c)
	if len(errs) != 0 {
		t.Fatalf("Config.json: %v", errors.Join(errs...))
	}
	return lim
}
