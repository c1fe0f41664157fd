package main

import (
	"flag"
	"fmt"
	"strings"
	"time"
)

// limit is the accepted range of one numeric flag. Every numeric flag is checked before a
// command does anything: a huge value overflows a time.Duration or takes forever, and zero or a
// negative one divides by zero, spins or means nothing; each must be a usage error that names
// the flag and its range instead.
type limit struct {
	flag          string
	value, lo, hi int64 // inclusive
	duration      bool  // value, lo and hi are time.Durations
}

func intRange(flag string, v, lo, hi int) limit {
	return limit{flag: flag, value: int64(v), lo: int64(lo), hi: int64(hi)}
}

func durationRange(flag string, v, lo, hi time.Duration) limit {
	return limit{flag: flag, value: int64(v), lo: int64(lo), hi: int64(hi), duration: true}
}

// outOfRange describes every flag of limits whose value is outside its range.
func outOfRange(limits ...limit) []string {
	var problems []string
	for _, l := range limits {
		if l.value >= l.lo && l.value <= l.hi {
			continue
		}
		show := func(v int64) string { return fmt.Sprint(v) }
		if l.duration {
			show = func(v int64) string { return time.Duration(v).String() }
		}
		problems = append(problems, fmt.Sprintf("--%s %s is out of range: give %s to %s", l.flag, show(l.value), show(l.lo), show(l.hi)))
	}
	return problems
}

// usageProblems is the usage error listing problems, after the command's usage; nil without.
func usageProblems(fs *flag.FlagSet, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", errUsage, strings.Join(problems, "; "))
}
