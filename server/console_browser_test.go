package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fencelock/fence/client"
)

// chromiumPath finds headless Chromium (scripts/chromium.sh installs it):
// $FENCE_TEST_CHROMIUM, /usr/bin/chromium or chromium on the PATH. Under
// CI a missing browser fails the test; elsewhere it skips it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("FENCE_TEST_CHROMIUM"), "/usr/bin/chromium"}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		if info, err := os.Stat(p); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return p
		}
	}
	msg := "no Chromium for the console's browser test: run scripts/chromium.sh (Debian's chromium package) or set FENCE_TEST_CHROMIUM"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// openBrowser starts headless Chromium and returns a context of one tab.
func openBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.WindowSize(1200, 800),
		// Chromium's sandbox refuses to run as root (CI containers); the
		// page it loads is the test's own.
		chromedp.NoSandbox,
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(alloc)
	ctx, cancel := context.WithTimeout(tab, 2*time.Minute)
	t.Cleanup(func() { cancel(); cancelTab(); cancelAlloc() })
	return ctx
}

// A real node, a lock taken with the Go client, the page in headless
// Chromium: the holder's session and token are in the DOM, with the FIFO
// waiters; a hand-off made after the page loaded shows up without a
// reload (pushed); a lock name that is markup stays text. The screenshot
// goes to docs/console.png when FENCE_UPDATE_DOCS is set (the README shows
// it), to the test's temp dir otherwise.
func TestConsoleInBrowser(t *testing.T) {
	browser := openBrowser(t)
	s, cl := startConsoleServer(t)
	ctx := context.Background()
	billing := mustSession(t, cl, "billing-worker")
	reports := mustSession(t, cl, "report-job")
	nightly := mustSession(t, cl, "nightly-cron")

	orders := client.NewMutex(billing, "orders")
	held := mustLock(t, orders)
	handedOff := make(chan *client.Grant, 1)
	go func() {
		g, _ := client.NewMutex(reports, "orders").Lock(ctx) // nil once its session closes
		handedOff <- g
	}()
	waitForWaiters(t, s, "orders", 1)
	go client.NewMutex(nightly, "orders").Lock(ctx)
	waitForWaiters(t, s, "orders", 2)
	for _, sess := range []*client.Session{reports, nightly} {
		if _, err := client.NewSemaphore(sess, "encoders", 4).Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mustLock(t, client.NewMutex(nightly, "invoices/2026-12"))

	ordersRow := `tr.lock[data-lock="orders"]`
	err := chromedp.Do(browser,
		chromedp.EmulateViewport(1200, 800),
		chromedp.Navigate("http://"+s.Addr()+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(ordersRow+` .holder`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	holder := mustRun(t, browser, chromedp.TextContent(chromedp.CSS(ordersRow+` .holder`)))
	waiters := mustRun(t, browser, chromedp.TextContent(chromedp.CSS(ordersRow+` td.waiters`)))
	lastToken := mustRun(t, browser, chromedp.TextContent(chromedp.ID("last-token")))
	shot := mustRun(t, browser, chromedp.CaptureScreenshot())
	wantHolder := fmt.Sprintf("session %d (billing-worker) token %d", billing.ID(), held.Token())
	if holder != wantHolder {
		t.Errorf("the page shows the holder of orders as %q, want %q", holder, wantHolder)
	}
	wantWaiters := fmt.Sprintf("1. session %d (report-job)2. session %d (nightly-cron)", reports.ID(), nightly.ID())
	if waiters != wantWaiters {
		t.Errorf("the page shows the waiters of orders as %q, want %q", waiters, wantWaiters)
	}
	if last, _ := strconv.ParseUint(lastToken, 10, 64); last < held.Token()+3 {
		t.Errorf("the page shows the last token as %q, want at least %d", lastToken, held.Token()+3)
	}
	saveScreenshot(t, shot)

	// Pushed, not reloaded: the hand-off shows up in the open page.
	mustUnlock(t, orders)
	next := <-handedOff
	if next == nil {
		t.Fatal("the waiter did not get orders")
	}
	newHolder := fmt.Sprintf(`%s .holder[data-session="%d"]`, ordersRow, reports.ID())
	if err := chromedp.Do(browser, chromedp.WaitVisible(chromedp.CSS(newHolder))); err != nil {
		t.Fatal(err)
	}
	token := mustRun(t, browser, chromedp.TextContent(chromedp.CSS(newHolder+` .token`)))
	if token != fmt.Sprint(next.Token()) {
		t.Errorf("after the hand-off the page shows token %q, want %d", token, next.Token())
	}

	// Markup in a lock name is shown as text and never run.
	const markup = `<img src=x onerror="document.title='pwned'"><script>document.title='pwned'</script>`
	mustLock(t, client.NewMutex(billing, markup))
	quoted, _ := json.Marshal(markup)
	shown := fmt.Sprintf(`[...document.querySelectorAll("tr.lock")].some(tr => tr.dataset.lock === %s && tr.querySelector("td.name").textContent === %s)`, quoted, quoted)
	if _, err := chromedp.Run(browser, chromedp.Poll[bool](shown, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the lock named %q does not show as text: %v", markup, err)
	}
	title := mustRun(t, browser, chromedp.Title())
	imgs := mustRun(t, browser, chromedp.Evaluate[int](`document.querySelectorAll("img").length`))
	scripts := mustRun(t, browser, chromedp.Evaluate[int](`document.querySelectorAll("script").length`))
	if title != "fence console" || imgs != 0 || scripts != 1 {
		t.Errorf("a lock name's markup reached the page: title %q, %d img elements, %d scripts", title, imgs, scripts)
	}
}

func mustRun[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitForWaiters waits until lock has n waiters in the node's state.
func waitForWaiters(t *testing.T, s *Server, lock string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d waiters for %s", n, lock), func() bool {
		l, _ := findLock(s.console.view(), lock)
		return len(l.Waiters) == n
	})
}

// saveScreenshot checks the screenshot is a 1200x800 PNG and keeps it.
func saveScreenshot(t *testing.T, shot []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 800 {
		t.Errorf("the screenshot is %dx%d, want 1200x800", b.Dx(), b.Dy())
	}
	path := filepath.Join(t.TempDir(), "console.png")
	if os.Getenv("FENCE_UPDATE_DOCS") != "" {
		path = filepath.Join("..", "docs", "console.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", strings.TrimPrefix(path, ".."+string(filepath.Separator)))
}
