package validator_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/psyche-go/psyche/programs/validator"
)

// A validator with a program preloaded, stopped when the context ends.
// (No output check: it needs node.)
func ExampleStart() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := validator.Start(ctx,
		validator.WithProgram("Fg6PaFpoGXkYsidMpWTK6W2BeZ7FEfcYkg476zPFsLnS", "programs/coordinator/coordinator.so"),
		validator.WithSlotDuration(100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("JSON-RPC at", v.RPC, "websocket at", v.WebSocket)
	if err := v.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err)
	}
}
