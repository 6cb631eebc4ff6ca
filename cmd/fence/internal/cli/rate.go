package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Every --session-rate (fence serve's, fence user add's and set-quota's)
// takes a rate the same way: N/s, N/m or N/h, sessions per second, minute
// or hour. N/s is canonical, and how fence prints a rate; a bare N is per
// second, as fence serve took it when it took only a number.

// rateSyntax says how a rate is written, for flags' help and errors.
const rateSyntax = "10/s (canonical), 30/m, 100/h; a bare number is per second"

// parseRate reads a rate: a number of sessions per second, or per /s,
// /m or /h.
func parseRate(s string) (float64, error) {
	num, per := s, 1.0
	if n, unit, ok := strings.Cut(s, "/"); ok {
		num = n
		switch unit {
		case "s":
		case "m":
			per = 60
		case "h":
			per = 3600
		default:
			return 0, fmt.Errorf("the unit after / is s, m or h (%s)", rateSyntax)
		}
	}
	r, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
		return 0, fmt.Errorf("not a rate of sessions (%s)", rateSyntax)
	}
	return r / per, nil
}

// rateText writes a rate of r sessions per second as fence prints it:
// "0.5/s", or "0" for none.
func rateText(r float64) string {
	if r == 0 {
		return "0"
	}
	return strconv.FormatFloat(r, 'g', -1, 64) + "/s"
}

// rateValue is a flag of sessions per second, written as parseRate reads
// and printed as rateText writes.
type rateValue float64

// newRate is a rate flag that sets *p, sessions per second.
func newRate(p *float64) *rateValue { return (*rateValue)(p) }

func (r *rateValue) Set(s string) error {
	v, err := parseRate(s)
	if err != nil {
		return err
	}
	*r = rateValue(v)
	return nil
}

func (r *rateValue) String() string { return rateText(float64(*r)) }
func (r *rateValue) Type() string   { return "rate" }

// want says what the flag takes, where fence serve's settings come from a
// variable or a file (serveconfig.go).
func (r *rateValue) want() string { return "a rate: " + rateSyntax }
