package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/testkit"
)

// benchDatabases returns the databases the benchmarks run on: SQLite, and
// PostgreSQL / SQL Server when SBCLAIM_TEST_POSTGRES_URL /
// SBCLAIM_TEST_SQLSERVER_URL are set.
func benchDatabases(b *testing.B) map[string]string {
	dbs := map[string]string{"sqlite": ""}
	if u := os.Getenv(testkit.PostgresURLEnv); u != "" {
		dbs["postgres"] = u
	}
	if u := os.Getenv(sqlServerURLEnv); u != "" {
		dbs["sqlserver"] = u
	}
	return dbs
}

func openBenchDB(b *testing.B, url string) *Database {
	b.Helper()
	db, err := OpenDatabase(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

// BenchmarkVariants measures every dedup variant per message
// (go test -bench Variants ./internal/testkit/chaos). Custom metrics: msg/s,
// round-trips/msg, peak-heap-bytes. b.N is the number of messages.
func BenchmarkVariants(b *testing.B) {
	for _, name := range []string{"sqlite", "postgres", "sqlserver"} {
		url, ok := benchDatabases(b)[name]
		if !ok {
			continue
		}
		b.Run(name, func(b *testing.B) {
			db := openBenchDB(b, url)
			for _, lat := range []time.Duration{0, 20 * time.Millisecond} {
				for _, conc := range []int{1, 16, 64} {
					for _, v := range Variants {
						b.Run(fmt.Sprintf("latency=%s/conc=%d/%s", lat, conc, v), func(b *testing.B) {
							res, err := RunBench(context.Background(), BenchParams{
								Variant: v, DB: db, Concurrency: conc, Latency: lat, Messages: b.N,
							})
							if err != nil {
								b.Fatal(err)
							}
							b.ReportMetric(res.PerSecond(), "msg/s")
							b.ReportMetric(res.TripsPerMessage(), "round-trips/msg")
							b.ReportMetric(float64(res.PeakHeapInuse), "peak-heap-bytes")
							b.ReportMetric(res.AllocPerMessage(), "alloc-bytes/msg")
							b.ReportMetric(0, "ns/op") // per-message time is msg/s; ns/op would count setup
						})
					}
				}
			}
		})
	}
}

// BenchmarkPhysicalHistory measures the physical limit (f) with the
// store's history writes on and off.
func BenchmarkPhysicalHistory(b *testing.B) {
	for _, name := range []string{"sqlite", "postgres", "sqlserver"} {
		url, ok := benchDatabases(b)[name]
		if !ok {
			continue
		}
		b.Run(name, func(b *testing.B) {
			db := openBenchDB(b, url)
			for _, history := range []bool{true, false} {
				b.Run(fmt.Sprintf("history=%t", history), func(b *testing.B) {
					res, err := RunBench(context.Background(), BenchParams{Variant: VariantPhysical, DB: db, Messages: b.N, NoHistory: !history})
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(res.PerSecond(), "msg/s")
					b.ReportMetric(res.AllocPerMessage(), "alloc-bytes/msg")
					b.ReportMetric(float64(res.CPUPerMessage().Nanoseconds()), "cpu-ns/msg")
					b.ReportMetric(0, "ns/op")
				})
			}
		})
	}
}

// BenchmarkStaleScan times the reconciler's FlagStale with nothing stale
// over 10 000 and 1 000 000 finished claims. Building the 1M table takes a
// few seconds per database (bulk INSERT ... SELECT).
func BenchmarkStaleScan(b *testing.B) {
	for _, name := range []string{"sqlite", "postgres", "sqlserver"} {
		url, ok := benchDatabases(b)[name]
		if !ok {
			continue
		}
		b.Run(name, func(b *testing.B) {
			db := openBenchDB(b, url)
			res, err := BenchScan(context.Background(), db, []int{10_000, 1_000_000}, max(b.N, 5))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(res[0].Median.Nanoseconds()), "ns/scan-10k")
			b.ReportMetric(float64(res[1].Median.Nanoseconds()), "ns/scan-1M")
			b.ReportMetric(float64(res[1].Median)/float64(res[0].Median), "ratio-1M/10k")
			b.ReportMetric(res[1].BuildTime.Seconds(), "build-1M-s")
		})
	}
}

// Every benchmark variant runs to the end on a real database and counts
// its round trips (no timing is asserted: the machines are shared).
func TestBenchVariantsRun(t *testing.T) {
	t.Parallel()
	db, err := OpenDatabase(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, v := range Variants {
		res, err := RunBench(context.Background(), BenchParams{Variant: v, DB: db, Concurrency: 8, Messages: 300})
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if res.Done != 300 {
			t.Errorf("%s: %d of 300 messages done", v, res.Done)
		}
		switch v {
		case VariantNoDedup:
			if res.RoundTrips != 0 {
				t.Errorf("%s: %d round trips, want none", v, res.RoundTrips)
			}
		case VariantPhysical:
			// 300 messages in batches of 128: 3 ClaimBatch + 3 WriteOutcomes.
			if res.RoundTrips != 6 {
				t.Errorf("%s: %d round trips, want 6", v, res.RoundTrips)
			}
		default:
			if res.RoundTrips == 0 {
				t.Errorf("%s: no round trips counted", v)
			}
		}
	}
}

// The stale-scan timing runs to the end (its sizes kept small here).
func TestBenchScanRuns(t *testing.T) {
	t.Parallel()
	db, err := OpenDatabase(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := BenchScan(context.Background(), db, []int{1000, 3000}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Rows != 1000 || res[1].Rows != 3000 || res[0].Median <= 0 {
		t.Fatalf("results %+v", res)
	}
}

// The benchmark table's targets include the allocations per message and
// the cost of history (no figure is asserted: the machines are shared).
func TestRunBenchmarksTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a small benchmark matrix")
	}
	var out strings.Builder
	err := RunBenchmarks(context.Background(), BenchConfig{SQLite: true, Concurrencies: []int{64}, Latencies: []time.Duration{0},
		NoScan: true, CellDuration: 100 * time.Millisecond}, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"- sqlite, 0s, conc 64: (a) allocates ",
		"target <= 27.0 KiB: ",
		"- sqlite: (f) with history = ",
		"x (f) without (",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the table:\n%s", want, out.String())
		}
	}
}
