package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The bench reports, beside each wall time, the CPU seconds it took per million rows on each
// side: wall times on a shared machine swing with its neighbours, CPU seconds much less.
//
//   - client: this process (the in-process backfills, stream and sync, with their GC) and the
//     processes it ran and waited for (psql, the connector, a tidemark sync, pgcopydb), from
//     getrusage;
//   - server: the PostgreSQL server the bench started: its postmaster's own time, the time of
//     its backends that exited (which the kernel adds to the postmaster's children's time when
//     it reaps them) and of those still running (from /proc). A backend that exits between two
//     readings moves from the second kind to the first, so the sum stays whole.

// cpuTimes are CPU seconds (user and system) of the client side and of the server.
type cpuTimes struct{ client, server float64 }

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{client: a.client - b.client, server: a.server - b.server}
}

// cpuMeter reads cpuTimes; server is 0 when /proc cannot tell (not Linux, another user's server).
type cpuMeter struct {
	postmaster int // 0: unknown
}

// clockTicks is the unit of /proc's times (USER_HZ, 100 on every Linux architecture Go runs on).
const clockTicks = 100.0

// newCPUMeter finds the server's postmaster: the parent of its checkpointer.
func newCPUMeter(ctx context.Context, conn *pgx.Conn) *cpuMeter {
	m := &cpuMeter{}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'`).Scan(&pid); err != nil {
		return m
	}
	if st, err := procStat(pid); err == nil {
		m.postmaster = st.ppid
	}
	return m
}

func (m *cpuMeter) read() cpuTimes {
	var t cpuTimes
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			t.client += tv(ru.Utime) + tv(ru.Stime)
		}
	}
	if m.postmaster == 0 {
		return t
	}
	// A backend that has exited and is not reaped yet (a zombie) shows its times nowhere: wait
	// a little for the postmaster to reap it (it does at once).
	for try := 0; ; try++ {
		ticks, zombies, err := m.serverTicks()
		if err != nil {
			return t
		}
		if !zombies || try == 100 {
			t.server = float64(ticks) / clockTicks
			return t
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serverTicks sums the CPU ticks of the postmaster, its reaped children and its live ones, and
// says whether a child is a zombie (exited, not reaped: its ticks are in neither sum). A child
// reaped while its siblings are read is in neither sum either (the postmaster was read before,
// the child's /proc is gone after: one CI run read 0 for COPY's backend this way): the
// postmaster is read again after them, and a change of its children's time counts as a zombie,
// so that the caller reads again.
func (m *cpuMeter) serverTicks() (ticks int64, zombies bool, err error) {
	pm, err := procStat(m.postmaster)
	if err != nil {
		return 0, false, err
	}
	defer func() {
		if again, aerr := procStat(m.postmaster); aerr == nil && again.cutime+again.cstime != pm.cutime+pm.cstime {
			zombies = true
		}
	}()
	ticks = pm.utime + pm.stime + pm.cutime + pm.cstime
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, err := procStat(pid); err == nil && st.ppid == m.postmaster {
			ticks += st.utime + st.stime
			zombies = zombies || st.state == 'Z'
		}
	}
	return ticks, zombies, nil
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// stat is what the meter reads of /proc/PID/stat, times in clock ticks.
type stat struct {
	state                        byte
	ppid                         int
	utime, stime, cutime, cstime int64
}

// procStat reads /proc/pid/stat (proc(5)): the fields after the command's name, which is in
// parentheses and may hold spaces or parentheses itself.
func procStat(pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	return parseStat(string(b))
}

func parseStat(s string) (stat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("no command name in %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime to cstime fields 14 to 17.
	if len(f) < 15 {
		return stat{}, fmt.Errorf("short stat %q", s)
	}
	st := stat{state: f[0][0]}
	var err error
	if st.ppid, err = strconv.Atoi(f[1]); err != nil {
		return stat{}, err
	}
	for k, dst := range []*int64{&st.utime, &st.stime, &st.cutime, &st.cstime} {
		if *dst, err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return stat{}, err
		}
	}
	return st, nil
}
