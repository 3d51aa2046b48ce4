package solurl

import "testing"

func TestWebsocketBeside(t *testing.T) {
	for _, tc := range []struct{ rpc, want string }{
		{"http://127.0.0.1:8899", "ws://127.0.0.1:8900"},
		{"https://rpc.example.com:443/x", "wss://rpc.example.com:444/x"},
		{"https://api.mainnet-beta.solana.com", "wss://api.mainnet-beta.solana.com"},
		{"http://[::1]:8899", "ws://[::1]:8900"},
		{"https://example.com/rpc", "wss://example.com/rpc"},
		{"https://example.com:8443/x?y", "wss://example.com:8444/x?y"},
		{"tcp://x:1", ""},
		{"http://127.0.0.1:65535", ""},
		{"ftp://127.0.0.1:8899", ""},
		{"http://127.0.0.1:0", ""},
		{"::", ""},
	} {
		got, err := WebsocketBeside(tc.rpc)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("WebsocketBeside(%q) = %q, %v; want %q", tc.rpc, got, err, tc.want)
		}
	}
}
