// Command holdports holds TCP ports on 127.0.0.1 until it is stopped, as a
// laptop running `docker compose up` does: .ci/run runs the test suite
// meanwhile, so that a test that needs one of those ports fails CI.
//
//	go run .ci/holdports.go -compose docker-compose.yml -ports 8080-8094 -ready FILE
//
// It holds every port the compose file publishes on 127.0.0.1 and every
// port of -ports, accepts connections and closes them at once, writes
// the ports it holds to FILE (-ready) once they are all bound, and exits
// on SIGTERM or SIGINT. A port something else already holds is taken
// anyway: it is reported and skipped.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	compose := flag.String("compose", "", "compose file whose 127.0.0.1 ports to hold")
	ports := flag.String("ports", "", "more ports: comma-separated numbers or ranges (8080-8094)")
	ready := flag.String("ready", "", "file to write the held ports to once they are bound")
	flag.Parse()

	want, err := portList(*compose, *ports)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holdports:", err)
		os.Exit(2)
	}
	var held []string
	for _, p := range want {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if errors.Is(err, syscall.EADDRINUSE) {
			fmt.Fprintf(os.Stderr, "holdports: 127.0.0.1:%d is already taken by something else\n", p)
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "holdports:", err)
			os.Exit(1)
		}
		held = append(held, strconv.Itoa(p))
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	line := "holding 127.0.0.1 ports " + strings.Join(held, " ")
	fmt.Println(line)
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte(line+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "holdports:", err)
			os.Exit(1)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// portList is the ports the compose file publishes on 127.0.0.1 and
// those of spec, sorted, each once.
func portList(compose, spec string) ([]int, error) {
	var out []int
	if compose != "" {
		b, err := os.ReadFile(compose)
		if err != nil {
			return nil, err
		}
		for _, m := range regexp.MustCompile(`"127\.0\.0\.1:(\d+):\d+`).FindAllStringSubmatch(string(b), -1) {
			p, _ := strconv.Atoi(m[1])
			out = append(out, p)
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("%s publishes no port on 127.0.0.1", compose)
		}
	}
	for _, part := range strings.Split(spec, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
			return nil, fmt.Errorf("-ports: %q is not a port or a range of ports", part)
		}
		for p := a; p <= b; p++ {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
