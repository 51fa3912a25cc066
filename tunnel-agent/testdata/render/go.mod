module kkp-envoy-agent-render

go 1.26
