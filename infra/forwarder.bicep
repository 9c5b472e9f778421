// Install the forwarder on existing Linux VMs and scale sets of one resource group: attach the
// forwarders' user-assigned identity and run infra/scripts/install-forwarder.sh through the
// Custom Script Extension. Deploy once per resource group that holds VMs (docs/deploy.md);
// the values come from the outputs of main.bicep.

targetScope = 'resourceGroup'

@description('Names of existing Linux VMs in this resource group.')
param vmNames array = []

@description('Names of existing Linux virtual machine scale sets in this resource group.')
param vmssNames array = []

@description('Resource id of the forwarders\' user-assigned identity (output forwarderIdentityResourceId of main.bicep).')
param forwarderIdentityResourceId string

@description('Client id of that identity (output forwarderIdentityClientId), written as AZURE_CLIENT_ID.')
param forwarderIdentityClientId string

@description('Fully qualified Service Bus namespace (output serviceBusNamespace), written as SEBRIDGE_NAMESPACE.')
param serviceBusNamespace string

@description('What pip installs on the VMs, as root. Required: this project is not published on PyPI, so the bare name there could be anyone\'s package. Give the https URL of a wheel you host (e.g. https://pkgs.example.com/sebridge/scheduled_events_bridge-0.3.0-py3-none-any.whl), or a pinned requirement (scheduled-events-bridge==0.3.0) only if the VMs\' pip index-url (/etc/pip.conf) is your own index. No http://, no credentials: the value is logged in the extension\'s status.')
@minLength(1)
param packageSource string

@description('Attach the identity to each VM and scale set (merged with the identities they already have). False if you attach it yourself (az vm identity assign).')
param attachIdentity bool = true

@description('Change to rerun the installer with unchanged settings (e.g. to pick up a new build behind the same packageSource).')
param forceUpdateTag string = ''

@description('The hooks file (JSON text, docs/vm-actions.md, "Act on the VM itself") installed on every VM as /etc/sebridge/hooks.json, root-owned, and given to the forwarder. Empty: no hooks. It names commands the forwarder runs: they must already be on the VMs (your image, or your own extension).')
@maxLength(65536)
param hooksJson string = ''

@description('Port of the drain probe (docs/vm-actions.md, "Act on the VM itself"): a load balancer health probe that answers 503 while an impactful event of the VM is on. 0: off.')
@minValue(0)
@maxValue(65535)
param drainProbePort int = 0

@description('Seconds from the first 503 of the drain probe until the VM counts as drained and Prepared is published: probe interval x unhealthy threshold + the connection drain time of your load balancer.')
@minValue(0)
@maxValue(86400)
param drainSeconds int = 30

@description('When the drain probe drains and the prepare hooks run: seconds before NotBefore per event type, or first-sight, e.g. Reboot=600,Freeze=first-sight (docs/vm-actions.md, "Act on the VM itself", --drain-lead). Empty: the defaults (Reboot and Redeploy 300, Freeze 120, Preempt and Terminate at first sight).')
@maxLength(1024)
param drainLead string = ''

@description('Longest run of 503 the drain probe answers before the event starts (then 200 until it starts): below the 600 s of the shortest grace period of a scale set\'s automatic instance repairs. Must be above drainSeconds.')
@minValue(1)
@maxValue(599)
param drainProbeMaxUnhealthySeconds int = 510

@description('Least time the drain probe answers 200 between two runs of 503, so that the load balancer and automatic repairs see the instance healthy again (--drain-probe-min-healthy-seconds). 0: no gap.')
@minValue(0)
@maxValue(3600)
param drainProbeMinHealthySeconds int = 90

// The script and the unit travel inside the command, base64-encoded: the VM runs exactly the
// files of this commit, needs no download location, and no value can break the shell quoting.
var scriptBase64 = loadFileAsBase64('scripts/install-forwarder.sh')
var unitBase64 = loadFileAsBase64('scripts/sebridge-forwarder.service')
// Optional settings travel the same way; an empty one is left out of the configuration.
var drainProbePortText = drainProbePort == 0 ? '' : string(drainProbePort)
var drainSecondsText = drainProbePort == 0 ? '' : string(drainSeconds)
var drainProbeMaxUnhealthyText = drainProbePort == 0 ? '' : string(drainProbeMaxUnhealthySeconds)
var drainProbeMinHealthyText = drainProbePort == 0 ? '' : string(drainProbeMinHealthySeconds)
var installCommand = 'mkdir -p sebridge && cd sebridge && echo ${scriptBase64} | base64 -d > install-forwarder.sh && echo ${unitBase64} | base64 -d > sebridge-forwarder.service && SEBRIDGE_NAMESPACE="$(echo ${base64(serviceBusNamespace)} | base64 -d)" AZURE_CLIENT_ID="$(echo ${base64(forwarderIdentityClientId)} | base64 -d)" SEBRIDGE_PACKAGE="$(echo ${base64(packageSource)} | base64 -d)" SEBRIDGE_HOOKS_JSON="$(echo ${base64(hooksJson)} | base64 -d)" SEBRIDGE_DRAIN_PROBE_PORT="$(echo ${base64(drainProbePortText)} | base64 -d)" SEBRIDGE_DRAIN_SECONDS="$(echo ${base64(drainSecondsText)} | base64 -d)" SEBRIDGE_DRAIN_LEAD="$(echo ${base64(drainLead)} | base64 -d)" SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS="$(echo ${base64(drainProbeMaxUnhealthyText)} | base64 -d)" SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS="$(echo ${base64(drainProbeMinHealthyText)} | base64 -d)" bash install-forwarder.sh'
// The extension reruns whenever what it would install changes.
var updateTag = empty(forceUpdateTag) ? uniqueString(installCommand) : forceUpdateTag

// Deployment names are limited to 64 characters and VM names may be as long: every name built
// from one is cut to 50 and made unique again with a 13-character hash.
module vms 'modules/forwarder-vm.bicep' = [for name in vmNames: {
  name: '${take('sebridge-forwarder-vm-${name}', 50)}-${uniqueString(name)}'
  params: {
    vmName: name
    forwarderIdentityResourceId: forwarderIdentityResourceId
    attachIdentity: attachIdentity
    installCommand: installCommand
    forceUpdateTag: updateTag
  }
}]

module scaleSets 'modules/forwarder-vmss.bicep' = [for name in vmssNames: {
  name: '${take('sebridge-forwarder-vmss-${name}', 50)}-${uniqueString(name)}'
  params: {
    vmssName: name
    forwarderIdentityResourceId: forwarderIdentityResourceId
    attachIdentity: attachIdentity
    installCommand: installCommand
    forceUpdateTag: updateTag
    drainProbePort: drainProbePort
  }
}]
