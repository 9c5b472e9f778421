// Install the forwarder on existing Linux VMs and scale sets of one resource group: attach the
// forwarders' user-assigned identity and run infra/scripts/install-forwarder.sh through the
// Custom Script Extension. Deploy once per resource group that holds VMs (README, Deploy);
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

@description('What pip installs on the VMs, as root. Required: this project is not published on PyPI, so the bare name there could be anyone\'s package. Give the https URL of a wheel you host (e.g. https://pkgs.example.com/sebridge/scheduled_events_bridge-0.1.0-py3-none-any.whl), or a pinned requirement (scheduled-events-bridge==0.1.0) only if the VMs\' pip index-url (/etc/pip.conf) is your own index. No http://, no credentials: the value is logged in the extension\'s status.')
@minLength(1)
param packageSource string

@description('Attach the identity to each VM and scale set (merged with the identities they already have). False if you attach it yourself (az vm identity assign).')
param attachIdentity bool = true

@description('Change to rerun the installer with unchanged settings (e.g. to pick up a new build behind the same packageSource).')
param forceUpdateTag string = ''

// The script and the unit travel inside the command, base64-encoded: the VM runs exactly the
// files of this commit, needs no download location, and no value can break the shell quoting.
var scriptBase64 = loadFileAsBase64('scripts/install-forwarder.sh')
var unitBase64 = loadFileAsBase64('scripts/sebridge-forwarder.service')
var installCommand = 'mkdir -p sebridge && cd sebridge && echo ${scriptBase64} | base64 -d > install-forwarder.sh && echo ${unitBase64} | base64 -d > sebridge-forwarder.service && SEBRIDGE_NAMESPACE="$(echo ${base64(serviceBusNamespace)} | base64 -d)" AZURE_CLIENT_ID="$(echo ${base64(forwarderIdentityClientId)} | base64 -d)" SEBRIDGE_PACKAGE="$(echo ${base64(packageSource)} | base64 -d)" bash install-forwarder.sh'
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
  }
}]
