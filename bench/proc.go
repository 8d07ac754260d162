package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// which is 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// ProcCPU returns the CPU time (user + system, all threads) the process
// has used so far, from /proc/PID/stat; resolution 10ms.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: cpu of %d: %w", pid, err)
	}
	return ParseProcStatCPU(b)
}

// ParseProcStatCPU extracts utime+stime from the text of /proc/PID/stat.
func ParseProcStatCPU(stat []byte) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: /proc stat: no command field")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc stat: %d fields", len(f)+2)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: /proc stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// ProcMemory returns the resident set size now (VmRSS) and its peak
// (VmHWM) in bytes, from /proc/PID/status.
func ProcMemory(pid int) (rss, peak uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("bench: memory of %d: %w", pid, err)
	}
	return ParseProcStatusMemory(b)
}

// ParseProcStatusMemory extracts VmRSS and VmHWM (bytes) from the text of
// /proc/PID/status.
func ParseProcStatusMemory(status []byte) (rss, peak uint64, err error) {
	var haveRSS, havePeak bool
	for line := range strings.Lines(string(status)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("bench: /proc status: bad %s line %q", name, strings.TrimSpace(line))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: /proc status: %s: %w", name, err)
		}
		if name == "VmRSS" {
			rss, haveRSS = kb<<10, true
		} else {
			peak, havePeak = kb<<10, true
		}
	}
	if !haveRSS || !havePeak {
		return 0, 0, fmt.Errorf("bench: /proc status: no VmRSS/VmHWM")
	}
	return rss, peak, nil
}

// Machine describes the host a benchmark ran on.
type Machine struct {
	CPUs      int    // logical CPUs available (nproc)
	CPUModel  string // "model name" of /proc/cpuinfo
	MemTotal  string // MemTotal of /proc/meminfo, e.g. "24.0 GiB"
	GoVersion string // toolchain that built the harness
	Kernel    string // uname -sr
	Memcached string // memcached -V
	LoadAvg   string // 1, 5 and 15 minute load averages when the run started
}

// DescribeMachine gathers the Machine facts; unknown ones are "?".
func DescribeMachine(memcachedBin string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), CPUModel: "?", MemTotal: "?", GoVersion: runtime.Version(), Kernel: "?", Memcached: "?", LoadAvg: LoadAverage()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if name, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if f := strings.Fields(v); len(f) == 2 {
					if kb, err := strconv.ParseUint(f[0], 10, 64); err == nil {
						m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
					}
				}
				break
			}
		}
	}
	if out, err := exec.Command("uname", "-sr").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command(memcachedBin, "-V").Output(); err == nil {
		m.Memcached = strings.TrimSpace(string(out))
	}
	return m
}

// LoadAverage returns the 1, 5 and 15 minute load averages of
// /proc/loadavg, or "?".
func LoadAverage() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			return strings.Join(f[:3], " ")
		}
	}
	return "?"
}
