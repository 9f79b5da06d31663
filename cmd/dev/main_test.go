package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sbclaim/sbclaim/internal/testkit"
)

// devBinary builds this command into dir.
func devBinary(t *testing.T, dir string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the test builds the command with the go tool, which is not on PATH: %v", err)
	}
	bin := filepath.Join(dir, "dev")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is the dev command running as a process, its standard output read
// line by line.
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	lines chan string
	out   strings.Builder // everything read so far
	done  chan error
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, lines: make(chan string, 1024), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	return p
}

// until reads lines until one matches re, and returns its submatches.
func (p *proc) until(re *regexp.Regexp, within time.Duration) []string {
	p.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("the dev command ended before printing a line matching %s; its output:\n%s", re, p.out.String())
			}
			p.out.WriteString(line + "\n")
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-deadline:
			p.t.Fatalf("no line matching %s within %s; the output so far:\n%s", re, within, p.out.String())
		}
	}
}

// stop interrupts the command as Ctrl-C does and waits for it to end.
func (p *proc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		p.t.Fatal(err)
	}
	p.until(regexp.MustCompile(`^stopped cleanly`), 30*time.Second)
	for range p.lines {
	}
	select {
	case err := <-p.done:
		if err != nil {
			p.t.Fatalf("the dev command did not exit cleanly after Ctrl-C: %v", err)
		}
	case <-time.After(15 * time.Second):
		p.t.Fatal("the dev command did not exit after Ctrl-C")
	}
}

var (
	consoleLine    = regexp.MustCompile(`^console: (http://127\.0\.0\.1:\d+)/$`)
	downstreamLine = regexp.MustCompile(`^  downstream: demo API at (http://127\.0\.0\.1:\d+) `)
	sentLine       = regexp.MustCompile(`^sent (\d+) messages to queue "payments" \(run ([0-9a-f]+)\):$`)
	copiesLine     = regexp.MustCompile(`^  (\d+) payments, (\d+) duplicate copies`)
	countLine      = regexp.MustCompile(`^  ([a-z -]+):\s+(\d+)\s*(.*)$`)
)

// TestDevCommand builds the dev command once and starts it as a process,
// on folders of the test's: its mix (testMix), and a restart after a stop
// with every claim unfinished (testRestartRecoversClaims).
func TestDevCommand(t *testing.T) {
	bin := devBinary(t, t.TempDir())
	t.Run("Mix", func(t *testing.T) { testMix(t, bin) })
	t.Run("RestartRecoversClaims", func(t *testing.T) { testRestartRecoversClaims(t, bin) })
}

// testMix waits for the console's address, lets the command send its mix,
// and checks the terminal summary, the demo downstream's counts (each
// payment effected exactly once) and the console's pages (the processed
// claims, one flagged claim); with SBCLAIM_TEST_CHROMIUM set, it also opens
// the console in headless Chromium. Then Ctrl-C, and a restart on the same
// folder finds the claims.
func testMix(t *testing.T, bin string) {
	const payments = 12
	dir := filepath.Join(t.TempDir(), "store")
	p := start(t, bin, "-dir", dir, "-console-addr", "127.0.0.1:0", "-payments", strconv.Itoa(payments), "-seed", "7")

	downstream := p.until(downstreamLine, 45*time.Second)[1]
	consoleURL := p.until(consoleLine, 10*time.Second)[1]
	sent := p.until(sentLine, 10*time.Second)
	run := sent[2]
	extra, _ := strconv.Atoi(p.until(copiesLine, time.Second)[2])
	p.until(regexp.MustCompile(`^summary of run `+run+` `), 45*time.Second)
	counts := map[string]int{}
	rest := map[string]string{}
	for {
		m := p.until(regexp.MustCompile(`^(running until Ctrl-C|  [a-z -]+:).*$`), 5*time.Second)
		if m[1] == "running until Ctrl-C" {
			break
		}
		line := m[0]
		c := countLine.FindStringSubmatch(line)
		if c == nil {
			t.Fatalf("summary line %q: no count", line)
		}
		counts[c[1]], _ = strconv.Atoi(c[2])
		rest[c[1]] = c[3]
	}
	want := map[string]int{"effected once": payments, "not once": 0, "failed": 1, "flagged": 1, "dead-lettered": 3, "duplicates": extra}
	for k, v := range want {
		if got, ok := counts[k]; !ok || got != v {
			t.Errorf("summary %q: %d (present %v), want %d\n%s", k, got, ok, v, p.out.String())
		}
	}
	if got := rest["dead-lettered"]; got != "EffectRejected 1, IdempotencyKeyConflict 1, NoRoute 1" {
		t.Errorf("dead-letter reasons %q", got)
	}
	if !strings.Contains(rest["failed"], run+"-pay-declined: EffectRejected") {
		t.Errorf("failed: %q, want the declined payment", rest["failed"])
	}
	if !strings.Contains(rest["flagged"], run+"-pay-stored-failure: ") || !strings.Contains(rest["flagged"], consoleURL+"/claims/") {
		t.Errorf("flagged: %q, want the stored failure and its console link", rest["flagged"])
	}

	// The downstream's own counts: each payment key effected exactly once,
	// nothing else effected.
	var dc struct {
		TotalEffects int `json:"totalEffects"`
		Keys         map[string]struct {
			Effects int `json:"effects"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(get(t, downstream+"/_counts"), &dc); err != nil {
		t.Fatal(err)
	}
	if dc.TotalEffects != payments {
		t.Errorf("the downstream performed %d effects, want %d", dc.TotalEffects, payments)
	}
	for i := 1; i <= payments; i++ {
		key := fmt.Sprintf("%s-pay-%04d", run, i)
		n := 0
		for k, c := range dc.Keys {
			if strings.HasSuffix(k, key) {
				n += c.Effects
			}
		}
		if n != 1 {
			t.Errorf("key %s: %d effects at the downstream, want 1", key, n)
		}
	}

	// The console: the processed claims, and one flagged.
	processed := string(get(t, consoleURL+"/claims?state=processed"))
	for i := 1; i <= payments; i++ {
		if key := fmt.Sprintf("%s-pay-%04d", run, i); !strings.Contains(processed, key) {
			t.Errorf("the console's processed list lacks %s", key)
		}
	}
	flagged := string(get(t, consoleURL+"/claims?state=flagged"))
	if n := strings.Count(flagged, `<tr id="claim-`); n != 1 || !strings.Contains(flagged, run+"-pay-stored-failure") {
		t.Errorf("the console's flagged list has %d rows (want 1, the stored failure):\n%s", n, flagged)
	}
	if exe := os.Getenv("SBCLAIM_TEST_CHROMIUM"); exe != "" {
		inBrowser(t, exe, consoleURL, run, payments)
	} else if testkit.Required("browser") {
		t.Errorf("the browser is required (%s) but SBCLAIM_TEST_CHROMIUM is not set", testkit.RequireEnv)
	}

	p.stop()

	// A restart on the same folder finds every claim of the first run.
	p = start(t, bin, "-dir", dir, "-payments", "0")
	m := p.until(regexp.MustCompile(`^resuming: the store holds (\d+) claims from earlier runs \((.*)\)$`), 45*time.Second)
	if m[1] != strconv.Itoa(payments+2) || m[2] != fmt.Sprintf("%d processed, 1 failed, 1 flagged", payments) {
		t.Errorf("after a restart: %q", m[0])
	}
	p.until(consoleLine, 10*time.Second)
	p.stop()
}

// testRestartRecoversClaims stops the dev command while the downstream
// is down (every claim of the mix unfinished, the messages only in the
// in-memory queue), and restarts it on the same folder: the reconciler
// recovers every claim from its stored payload, with its own key, so
// nothing claimed is lost.
func testRestartRecoversClaims(t *testing.T, bin string) {
	const payments = 4
	claims := payments + 2 // the declined payment and the stored failure
	dir := filepath.Join(t.TempDir(), "store")
	p := start(t, bin, "-dir", dir, "-payments", strconv.Itoa(payments), "-outage", "1000000", "-seed", "3")
	p.until(consoleLine, 45*time.Second)
	progress := regexp.MustCompile(`^  \.\.\. \d+ message\(s\) not yet settled; claims: (.*)$`)
	for {
		m := p.until(progress, 30*time.Second)
		total := 0
		for _, part := range strings.Split(m[1], ", ") {
			if n, st, ok := strings.Cut(part, " "); ok && (st == "claimed" || st == "released") {
				v, _ := strconv.Atoi(n)
				total += v
			}
		}
		if total == claims {
			break
		}
	}
	p.stop()

	p = start(t, bin, "-dir", dir, "-payments", "0")
	p.until(regexp.MustCompile(fmt.Sprintf(`^  %d unfinished: the reconciler recovers them`, claims)), 45*time.Second)
	m := p.until(regexp.MustCompile(`^resumed: the (\d+) claim\(s\) an earlier run left unfinished are now (.*); (\d+) effected once`), time.Minute)
	if m[1] != strconv.Itoa(claims) || m[2] != fmt.Sprintf("%d processed, 1 failed, 1 flagged", payments) || m[3] != strconv.Itoa(payments) {
		t.Errorf("after the restart: %q", m[0])
	}
	p.stop()
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return body
}

// inBrowser opens the console in headless Chromium: the overview shows
// one flagged claim, the processed list the mix's payments, and a
// screenshot of each is written (SBCLAIM_TEST_SCREENSHOTS, default the
// test's temporary directory).
func inBrowser(t *testing.T, exe, consoleURL, run string, payments int) {
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1360, 1000))
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelTab()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a guard against a wedged browser
	defer cancel()
	shots := os.Getenv("SBCLAIM_TEST_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	shot := func(name string) {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(consoleURL+"/"), chromedp.WaitVisible(chromedp.CSS("#count-flagged"))); err != nil {
		t.Fatalf("open the overview: %v", err)
	}
	if got, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#count-flagged"))); err != nil || strings.TrimSpace(got) != "1" {
		t.Errorf("the overview shows %q flagged (%v), want 1", got, err)
	}
	shot("dev-console-overview.png")
	if err := chromedp.Do(ctx, chromedp.Navigate(consoleURL+"/claims?state=processed"), chromedp.WaitVisible(chromedp.CSS("#claims"))); err != nil {
		t.Fatalf("open the processed list: %v", err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#claims tbody")))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= payments; i++ {
		if key := fmt.Sprintf("%s-pay-%04d", run, i); !strings.Contains(text, key) {
			t.Errorf("the browser's processed list lacks %s", key)
		}
	}
	shot("dev-console-processed.png")
}
