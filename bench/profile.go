package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// profileWindow is the length of one CPU profile the harness takes of a
// daemon: short, so that the windows end close to the end of a run.
const profileWindow = time.Second

// collectProfiles takes consecutive CPU profiles of the daemon at
// metricsURL (served with http.pprof) into dir, named group-NNN.pprof,
// until ctx ends; the window in progress then is lost. It returns the
// files written.
func collectProfiles(ctx context.Context, metricsURL, dir, group string) []string {
	var files []string
	client := &http.Client{Timeout: profileWindow + 10*time.Second}
	traced := make(chan string, 1)
	go func() { traced <- collectTrace(ctx, client, metricsURL, filepath.Join(dir, group+"-trace.out")) }()
	defer func() {
		if f := <-traced; f != "" {
			files = append(files, f)
		}
	}()
	for n := 0; ctx.Err() == nil; n++ {
		path := filepath.Join(dir, fmt.Sprintf("%s-%03d.pprof", group, n))
		if err := fetchProfile(ctx, client, metricsURL, path); err != nil {
			os.Remove(path)
			if ctx.Err() == nil {
				// Not serving yet: try again shortly.
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
			continue
		}
		files = append(files, path)
	}
	return files
}

// traceDelay is how long after the daemon starts serving its execution
// trace is taken: past start-up, into the steady part of a run.
const traceDelay = 500 * time.Millisecond

// collectTrace takes one execution trace of the daemon (profileWindow
// long, traceDelay into the run) into path and returns path, or "" when
// the run ended first.
func collectTrace(ctx context.Context, client *http.Client, metricsURL, path string) string {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(traceDelay):
		}
		url := fmt.Sprintf("%s/debug/pprof/trace?seconds=%d", metricsURL, int(profileWindow/time.Second))
		if err := fetchURL(ctx, client, url, path); err == nil {
			return path
		}
		os.Remove(path)
	}
	return ""
}

// fetchHeapProfile writes the daemon's heap profile (live and allocated
// memory so far) to path.
func fetchHeapProfile(ctx context.Context, metricsURL, path string) error {
	return fetchURL(ctx, &http.Client{Timeout: 30 * time.Second}, metricsURL+"/debug/pprof/heap", path)
}

func fetchProfile(ctx context.Context, client *http.Client, metricsURL, path string) error {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", metricsURL, int(profileWindow/time.Second))
	return fetchURL(ctx, client, url, path)
}

func fetchURL(ctx context.Context, client *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
