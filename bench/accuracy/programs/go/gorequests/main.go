// A request tracker that records every request in a package-level map and never deletes one
// (held growth in the Go heap). gorequests RATE
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

type request struct {
	id   int
	body []byte
}

var inflight = map[int]*request{}

//go:noinline
func trackRequest(id int) {
	inflight[id] = &request{id: id, body: make([]byte, 900)}
}

func main() {
	rate := 2000
	if len(os.Args) > 1 {
		rate, _ = strconv.Atoi(os.Args[1])
	}
	fmt.Printf("ready %d\n", os.Getpid())
	for id := 0; ; {
		for i := 0; i < rate/50; i++ {
			trackRequest(id)
			id++
		}
		time.Sleep(20 * time.Millisecond)
	}
}
